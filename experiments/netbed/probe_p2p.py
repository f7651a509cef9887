"""Gloo point-to-point exchange on a ring, timed per posting order (run one per rank; needs torch).

Every rank sends BYTES to rank k+1 and receives BYTES from rank k-1 at once (with 2 ranks the two peers are
the same rank). Orders: send_first (isend then irecv), recv_first (irecv then isend), and batch_send_first /
batch_recv_first (batch_isend_irecv with the ops in that order). The time of an iteration is the slowest
rank's; the bound is BYTES x 8 / NETBED_RATE_BPS (each direction of each link carries BYTES).
Rank 0 writes {order: {"times": [...], "median_s"}, "bound_s"} to --out.
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

ORDERS = ["send_first", "recv_first", "batch_send_first", "batch_recv_first"]


def exchange(order: str, send: torch.Tensor, recv: torch.Tensor, nxt: int, prv: int) -> None:
    if order.startswith("batch"):
        ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
        if order == "batch_recv_first":
            ops.reverse()
        works = dist.batch_isend_irecv(ops)
    elif order == "send_first":
        works = [dist.isend(send, nxt), dist.irecv(recv, prv)]
    else:
        works = [dist.irecv(recv, prv), dist.isend(send, nxt)]
    for w in works:
        w.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=32 * 2**20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    n = a.bytes // 4
    send = torch.full((n,), float(rank))
    recv = torch.empty(n)
    res: dict = {"world": world, "bytes": a.bytes}
    for order in ORDERS:
        times = []
        for i in range(a.iters + 1):
            dist.barrier()
            t0 = time.perf_counter()
            exchange(order, send, recv, nxt, prv)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            if not bool((recv == float(prv)).all()):
                raise SystemExit(f"rank {rank}: {order}: wrong data from rank {prv}")
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if i:
                times.append(dt.item())
        res[order] = {"times": times, "median_s": statistics.median(times)}
        if rank == 0:
            print(f"{order}: median {res[order]['median_s']:.4f} s", flush=True)
    rate = int(os.environ.get("NETBED_RATE_BPS", "0"))
    res["bound_s"] = a.bytes * 8 / rate if rate else None
    if rank == 0:
        print(json.dumps(res), flush=True)
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(res))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
