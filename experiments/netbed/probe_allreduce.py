"""Gloo's own all-reduce timed on a netbed rank (run one per rank under the launcher; needs torch).

Each iteration: barrier, then dist.all_reduce of a BYTES-sized tensor, timed on every rank; the time of an
iteration is the slowest rank's. The sum is checked (rank k contributes k + 1, so every element must equal
n(n+1)/2). Rank 0 writes {"times": [...], "median_s", "bytes", "world", "dtype", "ring_bound_s"} to --out
where ring_bound_s = 2(n-1)/n x bytes x 8 / NETBED_RATE_BPS (null when unshaped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=64 * 2**20)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, a.dtype)
    n = a.bytes // torch.empty((), dtype=dtype).element_size()
    times = []
    for i in range(a.warmup + a.iters):
        x = torch.full((n,), float(rank + 1), dtype=dtype)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        want = world * (world + 1) / 2
        if not bool((x == want).all()):
            raise SystemExit(f"rank {rank}: all_reduce gave {x[:4].tolist()}..., want {want}")
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i >= a.warmup:
            times.append(dt.item())
        if rank == 0:
            print(f"iter {i}{' (warmup)' if i < a.warmup else ''}: {dt.item():.4f} s", flush=True)
    rate = int(os.environ.get("NETBED_RATE_BPS", "0"))
    bound = 2 * (world - 1) / world * a.bytes * 8 / rate if rate else None
    res = {"world": world, "bytes": a.bytes, "dtype": a.dtype, "times": times,
           "median_s": statistics.median(times), "rate_bps": rate, "ring_bound_s": bound,
           "torch": torch.__version__}
    if rank == 0:
        print(json.dumps(res), flush=True)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(res))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
