"""All-reduce time: dynamiq against Gloo's own all-reduce and PyTorch's
built-in communication hooks, all measured in the same run.

    # loopback (no root), 2 and 4 local ranks:
    python experiments/bench/bench_allreduce.py --worlds 2 4 --sizes-mb 1 16 64
    # the emulated cluster (root): 4 ranks on 1 Gbit/s links
    python experiments/bench/bench_allreduce.py --netbed 1gbit --worlds 4 --sizes-mb 64

Writes experiments/results/<study>/ (README.md section and <part>.json; `--study`, default
allreduce_netbed or allreduce_loopback, `--part`, default the study's name); `--out DIR` for a
scratch run elsewhere.

Rows (`--methods`):
  gloo                     torch.distributed.all_reduce in the bucket dtype (--dtype): the baseline
  fp16                     the code path of torch's fp16_compress_hook: cast, divide, Gloo fp16 all-reduce, cast back
  <mode>:<topo>[:<bits>][@<block>]  dynamiq.all_reduce, e.g. none:ring, dynamiq:butterfly:5, lossless:ring,
                           bitsplit:twostep:4, dynamiq:ring:5@256k (pipelining block of 256 KiB),
                           dynamiq:hierarchical:5 (ranks per node: --local-size / LOCAL_WORLD_SIZE),
                           auto:ring:5 (mode auto; the modes it chose are in the JSON and the table)
  ddp:<hook>               a DDP model whose gradients are exactly one bucket of the size: time of
                           backward() minus the same backward under no_sync() (compute only), so it is
                           the hook's exposed communication time. <hook> = allreduce (DDP's default),
                           fp16 (fp16_compress_hook), powersgd1 / powersgd4 (powerSGD_hook, rank 1 / 4),
                           dynamiq5 (dynamiq.register, 5 bits, ring)
Columns: median time and spread of `--repeats` runs (slowest rank), algorithm and
bus bandwidth, bytes each rank sends (dynamiq's own count), the speedup over
Gloo, and the ideal speedup from bytes alone (Gloo's bytes / ours), so the gap to
the wire limit is visible. A row whose method fails shows its error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402


def dtype_size(name: str) -> int:
    return torch.empty(0, dtype=getattr(torch, name)).element_size()


# ---- methods --------------------------------------------------------------------------
def collective_runner(method: str, x: torch.Tensor, world: int):
    """A callable that all-reduces x (mean) in place and returns the bytes this rank sent, if known."""
    if method == "gloo":
        def run():
            dist.all_reduce(x)
            x.div_(world)
        return run
    if method == "fp16":
        def run():  # torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py: fp16_compress_hook
            c = x.to(torch.float16).div_(world)
            dist.all_reduce(c)
            x.copy_(c)
        return run
    import dynamiq
    from dynamiq.api import run_collective
    block = None
    if "@" in method:  # e.g. dynamiq:ring:5@256k: pipelining block size
        method, b = method.split("@")
        block = int(float(b.lower().rstrip("kmb").rstrip("k")) * {"k": 1 << 10, "m": 1 << 20}.get(b.lower()[-1], 1))
    parts = method.split(":")
    mode, topo = parts[0], parts[1] if len(parts) > 1 else "ring"
    kw = {"mode": mode, "topology": topo}
    if len(parts) > 2:
        kw["bits"] = int(parts[2]) if mode == "bitsplit" else float(parts[2])
    if block:
        kw["block_bytes"] = block
    cfg = dynamiq.Config(**kw)
    name = dist.group.WORLD.group_name
    seq = [0]

    choices = []

    def run():
        seq[0] += 1
        st = run_collective(x, name, cfg, "mean", seq[0])
        if st.get("auto_choice"):
            choices.append(st["auto_choice"])
        return st["bytes_sent"] + st["meta_bytes_sent"]
    run.choices = choices  # mode auto: the mode of each call, warm-up included
    return run


class _Flat(torch.nn.Module):
    """Square weight matrices totalling `numel` parameters (PowerSGD compresses matrices)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        side = 1024
        k = max(1, numel // (side * side))
        rows = numel // (k * side)
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(rows, side) * 1e-3) for _ in range(k))

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return sum((w * v[: w.shape[0], None]).sum() for w in self.ws)


def ddp_runner(method: str, numel: int, world: int):
    from torch.nn.parallel import DistributedDataParallel as DDP

    hook = method.split(":", 1)[1]
    model = _Flat(numel)
    nbytes = sum(p.numel() for p in model.parameters()) * 4
    ddp = DDP(model, bucket_cap_mb=nbytes / 2**20 + 1)  # one bucket: PowerSGD on Gloo needs it (FIELD-NOTES)
    state_holder = {}
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
        ddp.register_comm_hook(dist.group.WORLD, fp16_compress_hook)
    elif hook.startswith("powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        st = ps.PowerSGDState(process_group=dist.group.WORLD, matrix_approximation_rank=int(hook[8:]),
                              start_powerSGD_iter=2, min_compression_rate=1, use_error_feedback=True,
                              warm_start=True)
        ddp.register_comm_hook(st, ps.powerSGD_hook)
    elif hook == "dynamiq5":
        import dynamiq
        state_holder["s"] = dynamiq.register(ddp, dynamiq.Config(mode="dynamiq", bits=5.0))
    elif hook != "allreduce":
        raise ValueError(f"unknown DDP hook {hook!r}")
    g = torch.Generator().manual_seed(dist.get_rank())
    v = torch.randn(1024, generator=g)

    def backward(sync: bool):
        ddp.zero_grad(set_to_none=False)
        if sync:
            ddp(v).backward()
        else:
            with ddp.no_sync():
                ddp(v).backward()

    # compute-only backward time, to subtract
    import time
    for _ in range(2):
        backward(False)
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        backward(False)
        t.append(time.perf_counter() - t0)
    compute = sorted(t)[len(t) // 2]

    def run():
        backward(True)
        s = state_holder.get("s")
        if s is not None:
            return sum(x["bytes_sent"] + x["meta_bytes_sent"] for x in s.last_step_stats)
        return None
    return run, compute, nbytes


# ---- one rank --------------------------------------------------------------------------
def rank_main(rank: int, world: int, args, init_method: str, out_path: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.pg_timeout))
    rows = []
    dtype = getattr(torch, args.dtype)
    esize = dtype_size(args.dtype)
    for mb in args.sizes_mb:
        numel = int(mb * (1 << 20)) // esize
        g = torch.Generator().manual_seed(rank)
        x0 = (torch.randn(numel, generator=g) * 1e-3).to(dtype)
        x = x0.clone()
        for method in args.methods:
            row = benchlib.Row(method=method, world=world, bytes=numel * esize, dtype=args.dtype)
            try:
                if method.startswith("ddp:") and dtype != torch.float32:
                    raise ValueError("not run: the DDP rows train a float32 model")
                if method.startswith("ddp:"):
                    run, compute, nbytes = ddp_runner(method, numel, world)
                    row.bytes = nbytes
                    row.times, row.wire_bytes_per_rank = benchlib.time_collective(run, args.repeats, warmup=3)
                    row.times = [max(t - compute, 1e-9) for t in row.times]
                    row.extra["compute_s"] = compute
                else:
                    run = collective_runner(method, x, world)
                    row.times, row.wire_bytes_per_rank = benchlib.time_collective(
                        run, args.repeats, args.warmup, prepare=lambda: x.copy_(x0))
                    if getattr(run, "choices", None):
                        row.extra["auto_choices"] = list(run.choices)
            except Exception as e:  # noqa: BLE001 - a failing peer is a failed row, not a missing one
                row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                # a broken collective can leave the group unusable: stop this world's rows here
                rows.append(row)
                if rank == 0:
                    print(f"[bench] world {world} {mb:g} MB {method:20s} FAILED {row.error}", flush=True)
                if "Timeout" in row.error or "Connection" in row.error:
                    break
                continue
            rows.append(row)
            if rank == 0:
                print(f"[bench] world {world} {mb:g} MB {method:20s} median {row.median * 1e3:9.1f} ms "
                      f"spread {row.spread * 100:4.0f}%", flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump([r.to_dict() for r in rows], f)
    dist.destroy_process_group()




def report(rows: list, args, rate_bps: float) -> str:
    headers = ["world", "size", "method", "median ms", "spread", "algbw GB/s", "busbw GB/s",
               "bytes sent/rank", "speedup vs gloo", "ideal (bytes)"]
    if rate_bps:
        headers.append("% of wire bound")
    base = {(r["world"], r["bytes"]): r for r in rows if r["method"] == "gloo" and not r["error"]}
    table = []
    for r in rows:
        method = r["method"]
        ch = (r.get("extra") or {}).get("auto_choices")
        if ch:  # the modes auto chose in the timed calls (the last `repeats` ones)
            timed = ch[-len(r["times"]):]
            method += " (" + ", ".join(f"{m} {timed.count(m)}" for m in sorted(set(timed))) + ")"
        cells = [str(r["world"]), benchlib.fmt_bytes(r["bytes"]), method]
        if r["error"]:
            table.append(cells + ["failed: " + r["error"]] + [""] * (len(headers) - 4))
            continue
        b = base.get((r["world"], r["bytes"]))
        n = r["world"]
        gloo_bytes = 2 * (n - 1) / n * r["bytes"]  # ring all-reduce bytes per rank
        sent = r["wire_bytes_per_rank"]
        if sent is None and r["method"] in ("gloo", "ddp:allreduce"):
            sent = gloo_bytes
        elif sent is None and r["method"] in ("fp16", "ddp:fp16"):  # 2 bytes per element on the wire
            sent = gloo_bytes * 2 / dtype_size(r.get("dtype", "float32"))
        cells += [f"{r['median'] * 1e3:.1f}", f"{r['spread'] * 100:.0f}%", f"{r['algbw'] / 1e9:.3f}",
                  f"{r['busbw'] / 1e9:.3f}", benchlib.fmt_bytes(sent) if sent else "?",
                  f"{b['median'] / r['median']:.2f}x" if b else "-",
                  f"{gloo_bytes / sent:.2f}x" if sent else "?"]
        if rate_bps:  # unknown bytes (PowerSGD): no bound to compare with
            cells.append(f"{100 * sent * 8 / (rate_bps * benchlib.GOODPUT) / r['median']:.0f}%" if sent else "?")
        table.append(cells)
    return benchlib.markdown_table(headers, table)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    worker_out = None
    if argv and argv[0] == "--worker":
        worker_out, argv = argv[1], argv[2:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    p.add_argument("--methods", nargs="+", default=["gloo", "fp16", "none:ring", "none:butterfly"])
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bucket dtype (Gloo's own all-reduce takes bf16 on torch 2.14)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--netbed", default=None, help="run in the emulated cluster at this rate (e.g. 1gbit); root")
    p.add_argument("--local-size", type=int, default=None,
                   help="netbed: two levels, this many ranks per node, --netbed's rate only between nodes")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--pg-timeout", type=float, default=600)
    p.add_argument("--study", default=None,
                   help="results/<study>/ to write (default allreduce_netbed with --netbed, else allreduce_loopback)")
    p.add_argument("--part", default=None, help="this command's part of the study (default: the study's name)")
    p.add_argument("--out", default=None, help="study folder to write instead of experiments/results/<study>")
    args = p.parse_args(argv)
    if worker_out is not None:  # one rank inside the netbed: env:// rendezvous
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://", worker_out)
        return
    study = args.study or ("allreduce_netbed" if args.netbed else "allreduce_loopback")
    title = ("All-reduce on the emulated cluster: dynamiq against Gloo, PyTorch's hooks and PowerSGD" if args.netbed
             else "All-reduce on loopback: dynamiq's driver against Gloo")
    run = results_io.Run(study, title, script=__file__, argv=argv, out=args.out)
    rows = []
    for w in args.worlds:
        rows += (benchlib.run_world_netbed(__file__, w, args, local_size=args.local_size) if args.netbed
                 else benchlib.run_world_local(rank_main, w, args))
    rate_bps = benchlib.parse_rate(args.netbed) if args.netbed else 0.0
    md = report(rows, args, rate_bps)
    where = f"netbed at {args.netbed} per link" if args.netbed else "loopback (unshaped)"
    if args.netbed and args.local_size:
        where = (f"netbed, two levels: {args.local_size} ranks per node, unshaped inside a node, "
                 f"{args.netbed} per rank between nodes")
    # (the machine's load before and after the run: the part's command line and run.load in the JSON)
    header = (f"Network: {where}. Buckets: {args.dtype}. "
              f"Time = slowest rank, median of {args.repeats} repeats; spread = (max-min)/median; "
              f"{benchlib.BUSBW_FORMULA}; speedup = Gloo's median / this row's median (same run); "
              "ideal = Gloo's ring bytes per rank / this row's bytes per rank"
              + ("; % of wire bound = (bytes sent x 8 / goodput) / median" if rate_bps else "") + ".\n\n")
    print(header + md)
    path = run.write(args.part or study, header + md, data={"args": vars(args), "rows": rows})
    print(f"[bench] {path}")


if __name__ == "__main__":
    main()
