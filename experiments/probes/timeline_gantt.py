"""Where the wire idles: dynamiq's per-operation timeline (stats["timeline"]) as a Gantt chart per rank,
and each method's time against max(wire time, codec time), with Gloo's all-reduce in the same run.

    # the emulated cluster (root): 2 and 4 ranks at 1 Gbit/s, 64 MB float32; "~sa<k>" = at most k
    # sends posted ahead (DYNAMIQ_SEND_AHEAD=k for that row; 0: none), the rest as built
    python experiments/probes/timeline_gantt.py --netbed 1gbit --worlds 2 4 --size-mb 64 \\
        --methods gloo dynamiq:ring:5~sa0 dynamiq:ring:5
    # redraw one chart from a saved run
    python experiments/probes/timeline_gantt.py --draw experiments/results/overlap/overlap.json \\
        --world 2 --method dynamiq:ring:5 --png /tmp/gantt.png

Methods: `gloo` (torch.distributed.all_reduce, then divide), or <mode>:<topology>[:<bits>][~sa<k>]
(dynamiq through api.run_collective, mean). Each method: 2 warm-up calls, `--repeats` timed calls
(timeline off; time = slowest rank, median), then one more call with the timeline on, drawn as
<study>/gantt_w<world>_<method>.png: per rank, lanes for the driver's phases, the codec kernels,
sends (post to completion), receives (post to arrival, dark where the executor waited) and the
incoming wire, estimated from each arrival and its bytes at the link's goodput.

Columns: wire = the bytes this rank sends (data + statistics, the most of any rank) at goodput;
codec = statistics pass + kernels (t_local + t_kernel, the slowest rank's median); time / max(wire,
codec); speedup over Gloo; ideal = Gloo's ring bytes / ours (the bytes-only speedup); % of ideal.
Writes experiments/results/<study>/ (default `overlap`; `--out DIR` for a scratch run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

GOODPUT = 1448 / 1514  # TCP payload per Ethernet frame at MTU 1500 (benchlib.GOODPUT)


def parse_method(method: str):
    """'dynamiq:ring:5~sa0' -> (config kwargs, DYNAMIQ_SEND_AHEAD value or None)."""
    sa = None
    if "~sa" in method:
        method, sa = method.split("~sa")
    parts = method.split(":")
    kw = {"mode": parts[0], "topology": parts[1] if len(parts) > 1 else "ring"}
    if len(parts) > 2:
        kw["bits"] = int(parts[2]) if parts[0] == "bitsplit" else float(parts[2])
    return kw, sa


# ---- one rank (inside the netbed) ---------------------------------------------------------------
def rank_main(args, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = int(args.size_mb * (1 << 20)) // 4
    x0 = torch.randn(numel, generator=torch.Generator().manual_seed(rank)) * 1e-3
    x = x0.clone()
    name = dist.group.WORLD.group_name
    result = {"world": world, "numel": numel, "methods": {}}
    seq = 0
    for method in args.methods:
        times, stats, timeline = [], [], None
        if method == "gloo":
            def call(_tl):
                dist.all_reduce(x)
                x.div_(world)
                return None
        else:
            import dynamiq
            from dynamiq.api import run_collective
            kw, sa = parse_method(method)
            cfg = dynamiq.Config(**kw)

            def call(tl, cfg=cfg, sa=sa):
                nonlocal seq
                seq += 1
                if sa is not None:
                    os.environ["DYNAMIQ_SEND_AHEAD"] = sa
                try:
                    return run_collective(x, name, cfg, "mean", seq, timeline=tl)
                finally:
                    os.environ.pop("DYNAMIQ_SEND_AHEAD", None)
        for k in range(2 + args.repeats + 1):
            x.copy_(x0)
            tl = k == 2 + args.repeats
            dist.barrier()
            t0 = time.perf_counter()
            st = call(tl)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            if tl:
                timeline = st.get("timeline") if st else None
                continue
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if k >= 2:
                times.append(dt.item())
                if st:
                    stats.append({key: st[key] for key in ("bytes_sent", "meta_bytes_sent", "t_local", "t_header",
                                                          "t_meta", "t_plan", "t_kernel", "t_wait", "t_post",
                                                          "t_total", "path", "blocks")})
        everyone = [None] * world
        dist.all_gather_object(everyone, {"stats": stats, "timeline": timeline})
        result["methods"][method] = {"times": times, "ranks": everyone}
        if rank == 0:
            print(f"[timeline] world {world} {method:24s} median {statistics.median(times) * 1e3:8.1f} ms",
                  flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


# ---- summary and chart --------------------------------------------------------------------------
def summarize(res: dict, rate_bps: float) -> list:
    world, numel = res["world"], res["numel"]
    gloo_bytes = 2 * (world - 1) / world * numel * 4
    gloo = res["methods"].get("gloo")
    gloo_t = statistics.median(gloo["times"]) if gloo else None
    rows = []
    for method, m in res["methods"].items():
        t = statistics.median(m["times"])
        row = {"world": world, "method": method, "time_s": t, "spread": (max(m["times"]) - min(m["times"])) / t}
        if method == "gloo":
            row.update(bytes=gloo_bytes)
        else:
            per_rank = [r["stats"] for r in m["ranks"]]
            row["bytes"] = max(max(s["bytes_sent"] + s["meta_bytes_sent"] for s in st) for st in per_rank)
            row["codec_s"] = max(statistics.median(s["t_local"] + s["t_kernel"] for s in st) for st in per_rank)
            for key in ("t_local", "t_header", "t_meta", "t_plan", "t_kernel", "t_wait", "t_post"):
                row[key] = max(statistics.median(s[key] for s in st) for st in per_rank)
        row["wire_s"] = row["bytes"] * 8 / (rate_bps * GOODPUT) if rate_bps else None
        if "codec_s" in row and row["wire_s"]:
            row["bound_s"] = max(row["wire_s"], row["codec_s"])
            row["over_bound"] = t / row["bound_s"]
        if gloo_t:
            row["speedup"] = gloo_t / t
            row["ideal"] = gloo_bytes / row["bytes"]
            row["pct_of_ideal"] = 100 * row["speedup"] / row["ideal"]
        rows.append(row)
    return rows


def table(rows: list) -> str:
    head = ["ranks", "method", "time ms", "spread", "bytes/rank MB", "wire ms", "codec ms", "time/max(wire,codec)",
            "speedup vs Gloo", "ideal (bytes)", "% of ideal", "split ms: local/header/meta/plan/kernel/wait/post"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        f = lambda k, fmt="{:.1f}", s=1e3: fmt.format(r[k] * s) if r.get(k) is not None else "-"  # noqa: E731
        split = "/".join(f"{r[k] * 1e3:.0f}" for k in ("t_local", "t_header", "t_meta", "t_plan", "t_kernel",
                                                       "t_wait", "t_post")) if "t_local" in r else "-"
        out.append("| " + " | ".join([str(r["world"]), f"`{r['method']}`", f("time_s"), f("spread", "{:.0f}%", 100),
                                      f"{r['bytes'] / 1e6:.2f}", f("wire_s"), f("codec_s"),
                                      f("over_bound", "{:.2f}x", 1), f("speedup", "{:.2f}x", 1),
                                      f("ideal", "{:.2f}x", 1), f("pct_of_ideal", "{:.0f}%", 1), split]) + " |")
    return "\n".join(out)


KERNEL_COLORS = {"compress": "#1f77b4", "reduce-recompress": "#ff7f0e", "sink-reduce": "#d62728",
                 "sink-sum": "#d62728",
                 "decompress": "#2ca02c", "decompress-accumulate": "#9467bd", "local-sink": "#8c564b",
                 "local-final": "#8c564b"}
PHASE_COLORS = {"local": "#17becf", "header": "#7f7f7f", "meta": "#bcbd22", "plan": "#e377c2",
                "execute": "#c7c7c7", "exact": "#c7c7c7"}


def draw(timelines: list, title: str, png: str, rate_bps: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    timelines = [t for t in timelines if t]
    t0 = min(e["t_post"] for tl in timelines for e in tl["events"])
    lanes = ["phases", "kernels", "sends", "receives", "wire in (est.)"]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(14, 1.6 + 1.5 * len(timelines)), sharex=True, squeeze=False)
    for ax, tl in zip(axes[:, 0], timelines):
        ev = tl["events"]
        ms = lambda t: (t - t0) * 1e3  # noqa: E731
        for e in ev:
            k = e["kind"]
            if k == "phase":
                ax.broken_barh([(ms(e["t_start"]), ms(e["t_end"]) - ms(e["t_start"]))], (4.1, 0.8),
                               color=PHASE_COLORS.get(e["name"], "#aaaaaa"))
            elif k == "kernel":
                ax.broken_barh([(ms(e["t_start"]), ms(e["t_end"]) - ms(e["t_start"]))], (3.1, 0.8),
                               color=KERNEL_COLORS.get(e["name"], "#333333"))
            elif k == "send":
                ax.broken_barh([(ms(e["t_post"]), ms(e["t_end"]) - ms(e["t_post"]))], (2.1, 0.8),
                               color="#1f77b4" if e["part"] == "data" else "#bcbd22", alpha=0.25)
            elif k == "recv":
                ax.broken_barh([(ms(e["t_post"]), ms(e["t_end"]) - ms(e["t_post"]))], (1.1, 0.8),
                               color="#2ca02c" if e["part"] == "data" else "#bcbd22", alpha=0.08)
        for e in ev:  # on top: where the executor waited for a message
            if e["kind"] == "recv" and 0 <= e.get("t_need", -1) < e["t_end"]:
                ax.broken_barh([(ms(e["t_need"]), ms(e["t_end"]) - ms(e["t_need"]))], (1.1, 0.8),
                               color="#d62728")
        if rate_bps:
            prev = -1e30
            for e in sorted((e for e in ev if e["kind"] == "recv"), key=lambda e: e["t_end"]):
                start = max(prev, e["t_end"] - e["bytes"] * 8 / (rate_bps * GOODPUT))
                ax.broken_barh([(ms(start), ms(e["t_end"]) - ms(start))], (0.1, 0.8), color="#444444")
                prev = e["t_end"]
        ax.set_yticks([4.5, 3.5, 2.5, 1.5, 0.5])
        ax.set_yticklabels(lanes, fontsize=8)
        ax.set_ylim(0, 5)
        ax.set_ylabel(f"rank {tl['rank']}", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms since the first post on any rank")
    handles = [Patch(color=c, label=n) for n, c in KERNEL_COLORS.items() if n != "local-final"]
    handles += [Patch(color=c, label=f"phase {n}") for n, c in PHASE_COLORS.items() if n not in ("exact",)]
    handles += [Patch(color="#d62728", label="executor waits for a receive")]
    fig.legend(handles=handles, loc="upper center", ncol=6, fontsize=7, frameon=False)
    axes[0, 0].set_title(title, fontsize=10, pad=28)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(png, dpi=110)
    plt.close(fig)


def slug(method: str) -> str:
    return method.replace(":", "_").replace("~", "_").replace("@", "_")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    worker_out = None
    if argv and argv[0] == "--worker":
        worker_out, argv = argv[1], argv[2:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--netbed", default="1gbit", help="link rate of the emulated cluster (root)")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--size-mb", type=float, default=64)
    p.add_argument("--methods", nargs="+", default=["gloo", "dynamiq:ring:5~sa0", "dynamiq:ring:5"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--study", default="overlap")
    p.add_argument("--part", default=None, help="README part and JSON name (default: the study's name)")
    p.add_argument("--out", default=None, help="write here instead of experiments/results/<study>")
    p.add_argument("--draw", default=None, help="redraw from this JSON (with --world, --method, --png)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--method", default="dynamiq:ring:5")
    p.add_argument("--png", default="gantt.png")
    args = p.parse_args(argv)
    from experiments.netbed import parse_rate
    rate_bps = float(parse_rate(args.netbed) or 0)
    if worker_out is not None:
        rank_main(args, worker_out)
        return
    if args.draw:
        data = json.load(open(args.draw))
        res = next(r for r in data["worlds"] if r["world"] == args.world)
        tls = [r["timeline"] for r in res["methods"][args.method]["ranks"]]
        draw(tls, f"{args.method}, {args.world} ranks", args.png, rate_bps)
        print(args.png)
        return

    from experiments import results_io
    from experiments.netbed import run
    out = results_io.Run(args.study, "Overlap: the executor's timeline and the wire", script=__file__,
                         argv=argv, out=args.out)
    results, rows = [], []
    for w in args.worlds:
        tmp = tempfile.mkdtemp(prefix="dynamiq-timeline-")
        path = os.path.join(tmp, "result.json")
        res = run(os.path.abspath(__file__), ["--worker", path] + argv, world=w, rate=args.netbed,
                  timeout=args.timeout, stream=0)
        if not os.path.exists(path):
            res.raise_for_failure()
            raise SystemExit(f"world {w}: no result")
        r = json.load(open(path))
        results.append(r)
        rows += summarize(r, rate_bps)
        for method, m in r["methods"].items():
            tls = [x["timeline"] for x in m["ranks"]]
            if any(tls):
                png = out.path(f"gantt_w{w}_{slug(method)}.png")
                draw(tls, f"{method}, {w} ranks, {args.size_mb:g} MB float32, netbed {args.netbed}", png, rate_bps)
    md = table(rows)
    # (the load before and after the run: the README's header line and run.load in the JSON)
    md += ("\n\nCharts: "
           + ", ".join(f"[w{w} {m}](gantt_w{w}_{slug(m)}.png)" for w in args.worlds for m in args.methods if m != "gloo"))
    print(md)
    readme = out.write(args.part or args.study, md, data={"rows": rows, "worlds": results})
    print(readme)


if __name__ == "__main__":
    main()
