"""Host memory per rank of DDP training with and without dynamiq's hook.

    python experiments/bench/bench_memory.py                # 2 ranks, a 50M-parameter MLP, 25 MB buckets
    python experiments/bench/bench_memory.py --params-m 100 --bucket-mb 50
    python experiments/bench/bench_memory.py --pool-only  # only the buffer pool per mode, topology, world

Writes experiments/results/memory/ (with --pool-only: results/memory_pool/); `--out DIR` for a
scratch run elsewhere.

Each method runs in fresh rank processes (a process's peak RSS only grows):
build the model and wrap it in DDP (RSS then = "after DDP"), train `--steps`
steps with the method's communication, then read the peak (VmHWM) and the
final RSS (VmRSS) from /proc/self/status. Rows: `ddp` (DDP's own all-reduce,
the baseline), `fp16` (torch's fp16_compress_hook), `dynamiq:<mode>[:bits]`
(dynamiq.register). "extra" = this row's peak minus the baseline's peak in the
same run: what the method costs on top of plain DDP. The largest rank is
taken per run (ranks differ by a few MB), and the median over `--repeats`
runs, methods interleaved (one run's peak varies by tens of MB with when
glibc returns freed memory).

For dynamiq's rows, "pool after step 1" is what the group worker's buffer pool
held after DDP's first step (stats "pool_bytes"): an exact count of dynamiq's
message buffers, free of glibc's noise. `--pool-table` adds a second table:
the pool after one all-reduce (op mean, as the DDP hook) of a `--pool-mb`
float32 bucket per mode, topology and world size, in fresh processes.

CPU only (Gloo): this measures host memory. On a GPU the codec workspaces live
in device memory instead; not measured (no GPU here).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments import results_io  # noqa: E402

METHODS = ["ddp", "fp16", "dynamiq:none", "dynamiq:dynamiq:5", "dynamiq:lossless", "dynamiq:bitsplit:4"]


def status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def rank_main(rank: int, world: int, args, method: str, store: str, out) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    width = 2048
    layers = max(1, round(args.params_m * 1e6 / (width * width + width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    if method == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method.startswith("dynamiq:"):
        import dynamiq
        parts = method.split(":")
        kw = {"mode": parts[1]}
        if len(parts) > 2:
            kw["bits"] = int(parts[2]) if parts[1] == "bitsplit" else float(parts[2])
        state = dynamiq.register(ddp, dynamiq.Config(**kw))
    pool1 = None
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    nparams = sum(p.numel() for p in model.parameters())
    dist.barrier()
    after_ddp = status_kb("VmRSS")
    for step in range(args.steps):
        x = torch.randn(args.batch, width, generator=torch.Generator().manual_seed(step * world + rank))
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
        if step == 0 and method.startswith("dynamiq:"):
            pool1 = max(st["pool_bytes"] for st in state.last_step_stats)
        if rank == 0:
            print(f"  {method}: step {step + 1}/{args.steps}, RSS {status_kb('VmRSS') / 1024:.0f} MB", flush=True)
    dist.barrier()
    out.put({"rank": rank, "method": method, "params": nparams, "layers": layers,
             "after_ddp_kb": after_ddp, "peak_kb": status_kb("VmHWM"), "final_kb": status_kb("VmRSS"),
             "pool1_bytes": pool1})
    dist.destroy_process_group()


def run_method(method: str, args) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, args.world, args, method, f"file://{tmp}/store", out))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        res = [out.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        bad = [p.exitcode for p in procs if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"{method}: rank exit codes {bad}")
    worst = max(res, key=lambda r: r["peak_kb"])
    return dict(worst, ranks=res)


def pool_rank(rank: int, world: int, store: str, mb: float, cases, out) -> None:
    import torch
    import torch.distributed as dist
    import dynamiq
    from dynamiq import api

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    name = api.resolve_group(None)[1]
    x = torch.randn(int(mb * 2 ** 20) // 4, generator=torch.Generator().manual_seed(rank))
    for k, (mode, topo) in enumerate(cases):
        kw = {"mode": mode, "topology": topo}
        if mode == "bitsplit":
            kw["bits"] = 4
        # a fresh thread: its own buffer pool (pools are per thread), so no case sees another's buffers
        res = {}
        t = __import__("threading").Thread(
            target=lambda: res.update(api.run_collective(x.clone(), name, dynamiq.Config(**kw), "mean", k)))
        t.start()
        t.join()
        out.put({"rank": rank, "world": world, "mode": mode, "topology": topo, "pool_bytes": res["pool_bytes"]})
    dist.destroy_process_group()


def pool_table(args) -> list:
    ctx = mp.get_context("spawn")
    import dynamiq

    modes = ["none", "dynamiq", "lossless", "bitsplit"]
    topos = dynamiq.available_topologies(compositions=False)  # every schedule of this build
    cases = [(m, t) for m in modes for t in topos]
    rows = []
    for world in args.pool_worlds:
        print(f"[pool] world {world}: {len(cases)} all-reduces of {args.pool_mb:g} MB", flush=True)
        out = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:
            procs = [ctx.Process(target=pool_rank, args=(r, world, f"file://{tmp}/store", args.pool_mb, cases, out))
                     for r in range(world)]
            for p in procs:
                p.start()
            res = [out.get(timeout=1800) for _ in range(world * len(cases))]
            for p in procs:
                p.join(timeout=60)
        for m, t in cases:
            per_rank = sorted((r for r in res if r["mode"] == m and r["topology"] == t), key=lambda r: r["rank"])
            rows.append({"world": world, "mode": m, "topology": t,
                         "pool_mb": [r["pool_bytes"] / 2 ** 20 for r in per_rank]})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--params-m", type=float, default=50.0, help="model size, millions of parameters")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="fresh runs per method; the median is reported")
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--out", default=None,
                   help="study folder to write instead of experiments/results/memory (or memory_pool)")
    p.add_argument("--pool-table", action="store_true", help="also the pool after one all-reduce per case")
    p.add_argument("--pool-mb", type=float, default=96.0)
    p.add_argument("--pool-worlds", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--pool-only", action="store_true", help="only the pool table (no DDP runs)")
    args = p.parse_args(argv)
    if args.pool_only:
        args.pool_table, args.methods = True, []
    study = "memory_pool" if args.pool_only else "memory"
    run = results_io.Run(study, "Buffer pool per mode, topology and world size" if args.pool_only
                         else "Host memory per rank of DDP with each hook", script=__file__, argv=argv, out=args.out)

    runs = {m: [] for m in args.methods}
    total = len(args.methods) * args.repeats
    for k in range(args.repeats):
        for i, m in enumerate(args.methods):
            print(f"[{k * len(args.methods) + i + 1}/{total}] {m}", flush=True)
            runs[m].append(run_method(m, args))
    rows = []
    for m in args.methods:
        rs = sorted(runs[m], key=lambda r: r["peak_kb"])
        rows.append(dict(rs[len(rs) // 2], peaks_kb=[r["peak_kb"] for r in runs[m]]))
    base = next((r for r in rows if r["method"] == "ddp"), None)
    grad_mb = rows[0]["params"] * 4 / 2 ** 20 if rows else 0.0
    lines = [] if not rows else [
        f"{args.world} ranks, MLP of {rows[0]['layers']} x Linear(2048, 2048) = {rows[0]['params'] / 1e6:.1f}M "
        f"float32 parameters ({grad_mb:.0f} MB of gradients), bucket_cap_mb={args.bucket_mb:g}, "
        f"{args.steps} steps; largest rank, median of {args.repeats} runs; MB = 2^20 bytes.",
        "",
        "| method | RSS after DDP (MB) | peak RSS (MB) | peaks of the runs (MB) | final RSS (MB) | extra peak vs ddp (MB) | extra / gradient bytes | pool after step 1 (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        extra = (r["peak_kb"] - base["peak_kb"]) / 1024 if base else float("nan")
        peaks = " / ".join(f"{p / 1024:.0f}" for p in r["peaks_kb"])
        pool = "" if r.get("pool1_bytes") is None else f"{r['pool1_bytes'] / 2 ** 20:.1f}"
        lines.append(f"| {r['method']} | {r['after_ddp_kb'] / 1024:.0f} | {r['peak_kb'] / 1024:.0f} | {peaks} | "
                     f"{r['final_kb'] / 1024:.0f} | {extra:+.0f} | {extra / grad_mb:+.1%} | {pool} |")
    pool_rows = pool_table(args) if args.pool_table else []
    topos = list(dict.fromkeys(r["topology"] for r in pool_rows))  # those measured, in order
    if pool_rows:
        lines += ["", f"Buffer pool after one all-reduce (mean) of a {args.pool_mb:g} MB float32 bucket, "
                  "MB per rank (rank 0, 1, ...); dynamiq 5 bits, bitsplit 4 bits, default windows (16 MiB).", "",
                  "| world | mode | " + " | ".join(topos) + " |", "|---|---|" + "---|" * len(topos)]
        for world in args.pool_worlds:
            for m in ["none", "dynamiq", "lossless", "bitsplit"]:
                cells = []
                for t in topos:
                    row = next(r for r in pool_rows if r["world"] == world and r["mode"] == m and r["topology"] == t)
                    v = row["pool_mb"]
                    cells.append(f"{v[0]:.1f}" if max(v) - min(v) < 0.05 else " / ".join(f"{x:.1f}" for x in v))
                lines.append(f"| {world} | {m} | " + " | ".join(cells) + " |")
    md = "\n".join(lines)
    print(md)
    path = run.write(study, md, data={"args": vars(args), "rows": rows, "runs": runs, "pool_rows": pool_rows})
    print(f"[memory] {path}")


if __name__ == "__main__":
    main()
