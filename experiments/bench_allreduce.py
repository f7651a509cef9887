"""All-reduce time: dynamiq against Gloo's own all-reduce and PyTorch's fp16
compression, measured in the same run.

    python experiments/bench_allreduce.py --worlds 2 4 --sizes-mb 1 16 64 \
        --methods gloo fp16 none:ring none:butterfly --repeats 7

Methods: `gloo` (torch.distributed.all_reduce, float32: the baseline), `fp16`
(the code path of torch's fp16_compress_hook: cast to fp16, divide, Gloo
all-reduce in fp16, cast back), and `<mode>:<topology>[:<bits>]` for dynamiq
(e.g. `none:ring`, `dynamiq:butterfly:5`, `lossless:ring`,
`bitsplit:twostep:4`). Ranks are local processes on loopback unless
`--netbed RATE` runs them in the emulated cluster (experiments/netbed).
Writes JSON and a markdown table (default experiments/out/bench_allreduce.*).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def parse_method(m: str):
    if m in ("gloo", "fp16"):
        return m, None
    parts = m.split(":")
    mode, topo = parts[0], parts[1] if len(parts) > 1 else "ring"
    bits = float(parts[2]) if len(parts) > 2 else None
    return "dynamiq", (mode, topo, bits)


def make_runner(method: str, x: torch.Tensor, world: int):
    """A callable that all-reduces x in place (mean) and returns the bytes this rank sent, if known."""
    kind, spec = parse_method(method)
    if kind == "gloo":
        def run():
            dist.all_reduce(x)
            x.div_(world)
            return None
        return run
    if kind == "fp16":
        def run():  # torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook
            c = x.to(torch.float16).div_(world)
            dist.all_reduce(c)
            x.copy_(c)
            return None
        return run
    import dynamiq
    from dynamiq.api import run_collective
    mode, topo, bits = spec
    kw = {"mode": mode, "topology": topo}
    if bits is not None:
        kw["bits"] = int(bits) if mode == "bitsplit" else bits
    cfg = dynamiq.Config(**kw)
    name = dist.group.WORLD.group_name
    seq = [0]

    def run():
        seq[0] += 1
        st = run_collective(x, name, cfg, "mean", seq[0])
        return st["bytes_sent"] + st["meta_bytes_sent"]
    return run


def rank_main(rank: int, world: int, args, store: str, out_q) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    rows = []
    for mb in args.sizes_mb:
        numel = int(mb * (1 << 20)) // 4
        g = torch.Generator().manual_seed(rank)
        x0 = torch.randn(numel, generator=g) * 1e-3
        x = x0.clone()
        for method in args.methods:
            row = benchlib.Row(method=method, world=world, bytes=numel * 4, dtype="float32")
            try:
                run = make_runner(method, x, world)

                def fn():
                    x.copy_(x0)
                    return run()
                row.times, row.wire_bytes_per_rank = benchlib.time_collective(fn, args.repeats, args.warmup)
            except Exception as e:  # noqa: BLE001 - a failing peer is a failed row, not a missing one
                row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            if rank == 0:
                status = row.error or f"median {row.median * 1e3:.1f} ms"
                print(f"[bench] world {world} {mb:g} MB {method:24s} {status}", flush=True)
    if rank == 0:
        out_q.put([r.to_dict() for r in rows])
    dist.destroy_process_group()


def run_world(world: int, args) -> list:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    store = os.path.join(tempfile.mkdtemp(prefix="dynamiq-bench-"), "store")
    procs = [ctx.Process(target=rank_main, args=(r, world, args, store, q)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"world {world}: a rank failed (exit codes {[p.exitcode for p in procs]})")
    return q.get()


def report(rows: list, args) -> str:
    headers = ["world", "size", "method", "median ms", "spread", "algbw GB/s", "busbw GB/s",
               "bytes sent/rank", "vs gloo"]
    base = {(r["world"], r["bytes"]): r["median"] for r in rows if r["method"] == "gloo" and not r["error"]}
    table = []
    for r in rows:
        if r["error"]:
            table.append([str(r["world"]), benchlib.fmt_bytes(r["bytes"]), r["method"], "failed: " + r["error"],
                          "", "", "", "", ""])
            continue
        b = base.get((r["world"], r["bytes"]))
        table.append([str(r["world"]), benchlib.fmt_bytes(r["bytes"]), r["method"], f"{r['median'] * 1e3:.2f}",
                      f"{r['spread'] * 100:.0f}%", f"{r['algbw'] / 1e9:.3f}", f"{r['busbw'] / 1e9:.3f}",
                      benchlib.fmt_bytes(r["wire_bytes_per_rank"]) if r["wire_bytes_per_rank"] else "-",
                      f"{r['median'] / b:.2f}x" if b else "-"])
    return benchlib.markdown_table(headers, table)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    p.add_argument("--methods", nargs="+", default=["gloo", "fp16", "none:ring", "none:butterfly"])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out",
                                                 "bench_allreduce.json"))
    args = p.parse_args(argv)
    rows = []
    for w in args.worlds:
        rows += run_world(w, args)
    md = report(rows, args)
    cmd = "python experiments/bench_allreduce.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = (f"Command: `{cmd}`\n\nMachine: {benchlib.machine_info()}\n\n"
              f"Time = slowest rank, median of {args.repeats} repeats; spread = (max-min)/median; "
              f"{benchlib.BUSBW_FORMULA}; 'vs gloo' = median / Gloo's median in the same run (lower is faster).\n\n")
    print(header + md)
    benchlib.save(args.out, {"command": cmd, "machine": benchlib.machine_info(), "rows": rows}, header + md)


if __name__ == "__main__":
    main()
