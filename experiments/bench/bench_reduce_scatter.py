"""Reduce-scatter, all-gather and an FSDP2 training step: dynamiq against Gloo's own
collectives, all measured in the same run.

    # the emulated cluster (root): 4 ranks on 1 Gbit/s links, 64 MB
    python experiments/bench/bench_reduce_scatter.py --netbed 1gbit --worlds 4 --sizes-mb 64
    # loopback (no root)
    python experiments/bench/bench_reduce_scatter.py --worlds 2 --sizes-mb 16

Writes experiments/results/<study>/ (README.md section, <part>.json and <part>.png; `--study`,
default reduce_scatter_netbed or reduce_scatter_loopback; `--out DIR` for a scratch run).

Collective rows (`--methods`), float32, input of the size (reduce-scatter) or output of the
size (all-gather):
  gloo                     dist.reduce_scatter_tensor (sum), then / n: the baseline (mean)
  <mode>:<topo>[:<bits>]   dynamiq.reduce_scatter, mean, e.g. dynamiq:ring:5, none:ring, lossless:ring
  gloo_ag                  dist.all_gather_into_tensor
  ag:<mode>:<topo>         dynamiq.all_gather (mode none or lossless)
FSDP2 rows (`--fsdp`): a stack of `--fsdp-layers` Linear(d, d) layers, each its own FSDPModule,
`--fsdp-mb` MB of float32 parameters in all, batch 16; one SGD step timed (slowest rank, median of
`--repeats`), and the time spent inside the reduce-scatter and all-gather calls (FSDP2 on CPU calls
them synchronously, so that is the step's exposed communication time). Variants (`--fsdp-variants`):
  torch                    FSDP2's own collectives (Gloo)
  dynamiq                  dynamiq.fsdp.enable(model, Config(mode="dynamiq", bits=5)): reduce-scatter 5 bits,
                           all-gather lossless
  dynamiq-rs               the same reduce-scatter, torch's all-gather
each under `--fsdp-policies`: "fp32" (float32 parameters and gradients) and "bf16" (MixedPrecisionPolicy
param_dtype=bf16, reduce_dtype=fp32: bf16 all-gathers, fp32 reduce-scatters); parameters resharded
after forward or not (`--reshard`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402


# ---- collectives ------------------------------------------------------------------------
def collective_runner(method: str, x: torch.Tensor, world: int, rank: int):
    """A callable running one collective on x; returns the bytes this rank sent, if known."""
    m = x.numel() // world
    if method == "gloo":
        out = torch.empty(m)

        def run():
            dist.reduce_scatter_tensor(out, x)
            out.div_(world)
        return run
    if method == "gloo_ag":
        out = torch.empty(x.numel())
        shard = x[:m].clone()

        def run():
            dist.all_gather_into_tensor(out, shard)
        return run
    import dynamiq
    from dynamiq.api import run_sharded
    kind = "reduce_scatter"
    if method.startswith("ag:"):
        kind, method = "all_gather", method[3:]
    parts = method.split(":")
    kw = {"mode": parts[0], "topology": parts[1] if len(parts) > 1 else "ring"}
    if len(parts) > 2:
        kw["bits"] = int(parts[2]) if parts[0] == "bitsplit" else float(parts[2])
    cfg = dynamiq.Config(**kw)
    name = dynamiq.api.resolve_group(None)[1]
    seq = [0]
    if kind == "reduce_scatter":
        out = torch.empty(m)

        def run():
            seq[0] += 1
            st = run_sharded(kind, out, x, name, world, rank, cfg, "mean", seq[0])
            return st["bytes_sent"] + st["meta_bytes_sent"]
        return run
    out = torch.empty(x.numel())
    shard = x[:m].clone()

    def run():
        seq[0] += 1
        st = run_sharded(kind, out, shard, name, world, rank, cfg, "sum", seq[0])
        return st["bytes_sent"]
    return run


# ---- FSDP2 --------------------------------------------------------------------------
def fsdp_rows(rank: int, world: int, args) -> list:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_api
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    import dynamiq

    class TimedRS(_fsdp_api.ReduceScatter):
        def __init__(self, inner, clock):
            self.inner, self.clock = inner, clock

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            t0 = time.perf_counter()
            r = self.inner(output_tensor, input_tensor, group, op, async_op)
            self.clock["rs"] += time.perf_counter() - t0
            return r

    class TimedAG(_fsdp_api.AllGather):
        def __init__(self, inner, clock):
            self.inner, self.clock = inner, clock

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            t0 = time.perf_counter()
            r = self.inner(output_tensor, input_tensor, group, async_op)
            self.clock["ag"] += time.perf_counter() - t0
            return r

    d = args.fsdp_dim
    layers = max(1, int(args.fsdp_mb * (1 << 20) / 4 / (d * d)))
    rows = []
    for policy in args.fsdp_policies:
        for variant in args.fsdp_variants:
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, d, bias=False), torch.nn.ReLU())
                                          for _ in range(layers)])
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
                if policy == "bf16" else MixedPrecisionPolicy()
            for blk in model:
                fully_shard(blk, mp_policy=mp, reshard_after_forward=args.reshard)
            fully_shard(model, mp_policy=mp, reshard_after_forward=args.reshard)
            clock = {"rs": 0.0, "ag": 0.0}
            state = None
            if variant in ("dynamiq", "dynamiq-rs"):
                state = dynamiq.fsdp.enable(model, dynamiq.Config(mode="dynamiq", bits=5.0),
                                            all_gather="lossless" if variant == "dynamiq" else None)
            for name, mod in model.named_modules():
                if not hasattr(mod, "set_custom_reduce_scatter"):
                    continue
                groups = mod._get_fsdp_state()._fsdp_param_groups
                if not groups:
                    continue
                g = groups[0]
                mod.set_custom_reduce_scatter(TimedRS(g._reduce_scatter_comm if state else DefaultReduceScatter(), clock))
                mod.set_custom_all_gather(TimedAG(g._all_gather_comm if variant == "dynamiq" else DefaultAllGather(),
                                                  clock))
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            x = torch.randn(16, d, generator=torch.Generator().manual_seed(rank))

            def step():
                loss = model(x).float().pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()

            row = benchlib.Row(method=f"fsdp:{variant}:{policy}", world=world, bytes=layers * d * d * 4,
                               dtype="float32")
            try:
                for _ in range(args.warmup + 1):
                    step()
                comm, times = [], []
                for _ in range(args.repeats):
                    clock["rs"] = clock["ag"] = 0.0
                    dist.barrier()
                    t0 = time.perf_counter()
                    step()
                    # the slowest rank's step, and its time inside the collectives
                    mine = [time.perf_counter() - t0, clock["rs"] + clock["ag"], clock["rs"], clock["ag"]]
                    every = [torch.zeros(4, dtype=torch.float64) for _ in range(world)]
                    dist.all_gather(every, torch.tensor(mine, dtype=torch.float64))
                    slowest = max(every, key=lambda t: t[0].item())
                    times.append(slowest[0].item())
                    comm.append(slowest[1:].tolist())
                row.times = times
                comm.sort(key=lambda c: c[0])
                row.extra = {"comm_s": comm[len(comm) // 2][0], "rs_s": comm[len(comm) // 2][1],
                             "ag_s": comm[len(comm) // 2][2], "layers": layers, "dim": d, "reshard": args.reshard}
                if state is not None:
                    row.extra["summary"] = state.summary()
            except Exception as e:  # noqa: BLE001
                row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            if rank == 0:
                print(f"[bench] world {world} {row.method:26s} step {row.median * 1e3:8.1f} ms, comm "
                      f"{row.extra.get('comm_s', float('nan')) * 1e3:8.1f} ms", flush=True)
            del model, opt, state
    return rows


# ---- one rank --------------------------------------------------------------------------
def rank_main(rank: int, world: int, args, init_method: str, out_path: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.pg_timeout))
    rows = []
    for mb in args.sizes_mb:
        numel = int(mb * (1 << 20)) // 4 // world * world
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(numel, generator=g) * 1e-3
        for method in args.methods:
            row = benchlib.Row(method=method, world=world, bytes=numel * 4, dtype="float32")
            try:
                run = collective_runner(method, x, world, rank)
                row.times, row.wire_bytes_per_rank = benchlib.time_collective(run, args.repeats, args.warmup)
            except Exception as e:  # noqa: BLE001
                row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            if rank == 0:
                print(f"[bench] world {world} {mb:g} MB {method:20s} median {row.median * 1e3:9.1f} ms "
                      f"spread {row.spread * 100:4.0f}%", flush=True)
    if args.fsdp:
        rows += fsdp_rows(rank, world, args)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump([r.to_dict() for r in rows], f)
    dist.destroy_process_group()




# ---- report --------------------------------------------------------------------------
def report(rows: list, rate_bps: float) -> str:
    out = []
    coll = [r for r in rows if not r["method"].startswith("fsdp:")]
    if coll:
        headers = ["world", "size", "shard (elements)", "method", "median ms", "spread", "bytes sent/rank",
                   "speedup vs gloo", "ideal (bytes)"] + (["% of wire bound"] if rate_bps else [])
        table = []
        for r in coll:
            ag = r["method"].startswith("ag:") or r["method"] == "gloo_ag"
            base = next((b for b in coll if b["method"] == ("gloo_ag" if ag else "gloo") and b["world"] == r["world"]
                         and b["bytes"] == r["bytes"] and not b["error"]), None)
            cells = [str(r["world"]), benchlib.fmt_bytes(r["bytes"]), str(r["bytes"] // 4 // r["world"]), r["method"]]
            if r["error"]:
                table.append(cells + ["failed: " + r["error"]] + [""] * (len(headers) - 5))
                continue
            n = r["world"]
            gloo_bytes = (n - 1) / n * r["bytes"]  # a ring reduce-scatter's (or all-gather's) bytes per rank
            sent = r["wire_bytes_per_rank"] or (gloo_bytes if r["method"] in ("gloo", "gloo_ag") else None)
            cells += [f"{r['median'] * 1e3:.1f}", f"{r['spread'] * 100:.0f}%", benchlib.fmt_bytes(sent) if sent else "?",
                      f"{base['median'] / r['median']:.2f}x" if base else "-", f"{gloo_bytes / sent:.2f}x" if sent else "?"]
            if rate_bps:
                cells.append(f"{100 * sent * 8 / (rate_bps * benchlib.GOODPUT) / r['median']:.0f}%" if sent else "?")
            table.append(cells)
        out.append(benchlib.markdown_table(headers, table))
    fs = [r for r in rows if r["method"].startswith("fsdp:")]
    if fs:
        headers = ["world", "params", "variant", "policy", "step ms", "comm ms (rs + ag)", "compute ms",
                   "comm cut", "step speedup"]
        table = []
        for r in fs:
            _, variant, policy = r["method"].split(":")
            base = next((b for b in fs if b["method"] == f"fsdp:torch:{policy}" and b["world"] == r["world"]
                         and not b["error"]), None)
            cells = [str(r["world"]), benchlib.fmt_bytes(r["bytes"]), variant, policy]
            if r["error"]:
                table.append(cells + ["failed: " + r["error"]] + [""] * 4)
                continue
            e = r["extra"]
            cells += [f"{r['median'] * 1e3:.1f}", f"{e['comm_s'] * 1e3:.1f} ({e['rs_s'] * 1e3:.0f} + {e['ag_s'] * 1e3:.0f})",
                      f"{(r['median'] - e['comm_s']) * 1e3:.1f}",
                      f"{base['extra']['comm_s'] / e['comm_s']:.2f}x" if base else "-",
                      f"{base['median'] / r['median']:.2f}x" if base else "-"]
            table.append(cells)
        out.append(benchlib.markdown_table(headers, table))
    return "\n\n".join(out)


def plot(rows: list, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coll = [r for r in rows if not r["method"].startswith("fsdp:") and not r["error"]]
    fs = [r for r in rows if r["method"].startswith("fsdp:") and not r["error"]]
    fig, axes = plt.subplots(1, 2 if fs else 1, figsize=(12 if fs else 7, 4.2), squeeze=False)
    ax = axes[0][0]
    labels = [f"{r['method']} (n={r['world']}, {benchlib.fmt_bytes(r['bytes'])})" for r in coll]
    ax.barh(range(len(coll)), [r["median"] * 1e3 for r in coll],
            color=["tab:gray" if r["method"].startswith("gloo") else "tab:blue" for r in coll])
    ax.set_yticks(range(len(coll)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms (slowest rank, median)")
    ax.set_title("reduce-scatter / all-gather")
    if fs:
        ax = axes[0][1]
        names = [r["method"][5:] for r in fs]
        comm = [r["extra"]["comm_s"] * 1e3 for r in fs]
        comp = [(r["median"] - r["extra"]["comm_s"]) * 1e3 for r in fs]
        ax.barh(range(len(fs)), comm, color="tab:red", label="communication (rs + ag)")
        ax.barh(range(len(fs)), comp, left=comm, color="tab:green", label="everything else")
        ax.set_yticks(range(len(fs)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms per FSDP2 step (slowest rank, median)")
        ax.legend(fontsize=7)
        ax.set_title("FSDP2 step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    worker_out = None
    if argv and argv[0] == "--worker":
        worker_out, argv = argv[1], argv[2:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[4])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[64])
    p.add_argument("--methods", nargs="+", default=[
        "gloo", "none:ring", "lossless:ring", "dynamiq:ring:5", "dynamiq:butterfly:5", "dynamiq:twostep:5",
        "bitsplit:ring:4", "gloo_ag", "ag:none:ring", "ag:lossless:ring"])
    p.add_argument("--fsdp", action="store_true", help="also time FSDP2 steps")
    p.add_argument("--fsdp-mb", type=float, default=64)
    p.add_argument("--fsdp-dim", type=int, default=2048)
    p.add_argument("--fsdp-variants", nargs="+", default=["torch", "dynamiq", "dynamiq-rs"])
    p.add_argument("--fsdp-policies", nargs="+", default=["fp32"],
                   help="fp32 and/or bf16 (bf16 matmuls on a CPU without AMX take seconds per step)")
    p.add_argument("--reshard", action=argparse.BooleanOptionalAction, default=False,
                   help="reshard parameters after forward (an all-gather in forward and one in backward)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--netbed", default=None, help="run in the emulated cluster at this rate (e.g. 1gbit); root")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--pg-timeout", type=float, default=600)
    p.add_argument("--study", default=None)
    p.add_argument("--part", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if worker_out is not None:
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://", worker_out)
        return
    study = args.study or ("reduce_scatter_netbed" if args.netbed else "reduce_scatter_loopback")
    title = "Reduce-scatter, all-gather and FSDP2 steps" + (" on the emulated cluster" if args.netbed else " on loopback")
    run = results_io.Run(study, title, script=__file__, argv=argv, out=args.out)
    rows = []
    for w in args.worlds:
        rows += (benchlib.run_world_netbed(__file__, w, args) if args.netbed
                 else benchlib.run_world_local(rank_main, w, args))
    rate_bps = benchlib.parse_rate(args.netbed) if args.netbed else 0.0
    md = report(rows, rate_bps)
    where = f"netbed at {args.netbed} per link" if args.netbed else "loopback (unshaped)"
    header = (f"Network: {where}. float32. Time = slowest rank, median of {args.repeats} repeats; "
              "spread = (max-min)/median; speedup = Gloo's median / this row's (same run); ideal = a ring's "
              "(n-1)/n x size bytes per rank / this row's bytes"
              + ("; % of wire bound = (bytes sent x 8 / goodput) / median" if rate_bps else "")
              + ". FSDP2: comm = time inside the reduce-scatter and all-gather calls per step (synchronous on "
              "CPU), compute = step - comm; comm cut and step speedup against the torch row of the same "
              "policy.\n\n")
    print(header + md)
    part = args.part or study
    png = run.path(part + ".png")
    plot(rows, png)
    path = run.write(part, header + md, data={"args": vars(args), "rows": rows}, plot=png)
    print(f"[bench] {path}")


if __name__ == "__main__":
    main()
