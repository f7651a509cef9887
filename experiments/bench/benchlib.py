"""One timing helper for every benchmark (STYLE.md #11); results go through experiments/results_io.py.

A measurement is a collective run `repeats` times after `warmup` runs; each
repeat starts after a barrier and its time is the slowest rank's (an
all-reduce MAX of the per-rank durations), so a rank that finishes early does
not flatter the number. Reported: median, min, max, and

    algorithm bandwidth algbw = bytes / time
    bus bandwidth       busbw = algbw * 2 (n - 1) / n

(nccl-tests' convention: busbw is comparable to the link rate for ring
all-reduce).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

BUSBW_FORMULA = "busbw = algbw * 2(n-1)/n, algbw = bucket bytes / median time"
# tbf counts 1514-byte Ethernet frames carrying 1448 bytes of TCP payload
# (experiments/results/netbed/README.md): goodput = rate * 1448 / 1514.
GOODPUT = 1448 / 1514


def parse_rate(rate: str) -> float:
    """'100mbit', '1gbit', '2.5g', '10gbit' -> bits per second (0 for 'none')."""
    r = rate.lower().strip()
    if r in ("none", "0"):
        return 0.0
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("g", 1e9), ("m", 1e6), ("k", 1e3)):
        if r.endswith(suffix):
            return float(r[: -len(suffix)]) * mult
    return float(r)


@dataclass
class Row:
    method: str
    world: int
    bytes: int
    dtype: str
    times: List[float] = field(default_factory=list)
    wire_bytes_per_rank: Optional[float] = None  # bytes this rank sent per call (max over ranks)
    error: Optional[str] = None
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def spread(self) -> float:
        """(max - min) / median over the repeats."""
        return (max(self.times) - min(self.times)) / self.median if self.times else float("nan")

    def algbw(self) -> float:
        return self.bytes / self.median

    def busbw(self) -> float:
        return self.algbw() * 2 * (self.world - 1) / self.world if self.world > 1 else float("nan")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(median=self.median, spread=self.spread, algbw=self.algbw() if self.times else None,
                 busbw=self.busbw() if self.times else None)
        return d


def time_collective(fn: Callable[[], Optional[float]], repeats: int, warmup: int = 1,
                    prepare: Optional[Callable[[], object]] = None) -> tuple:
    """Runs fn (which may return bytes sent by this rank) warmup + repeats times;
    `prepare` (untimed) runs before each.

    Returns (times, max bytes sent per call over ranks). Must be called on
    every rank of the default group.
    """
    sent = 0.0
    for _ in range(warmup):
        if prepare:
            prepare()
        fn()
    times = []
    for _ in range(repeats):
        if prepare:
            prepare()
        dist.barrier()
        t0 = time.perf_counter()
        b = fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item())
        if b is not None:
            sent = max(sent, float(b))
    s = torch.tensor([sent], dtype=torch.float64)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    return times, (s.item() if s.item() > 0 else None)


def fmt_bytes(b: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def markdown_table(headers: List[str], rows: List[List[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def run_world_local(rank_main: Callable, world: int, args) -> list:
    """Runs rank_main(rank, world, args, init_method, out_path) on `world` spawned processes
    on this machine (loopback); returns the rows rank 0 wrote to out_path."""
    import json
    import os
    import tempfile

    import torch.multiprocessing as mp

    tmp = tempfile.mkdtemp(prefix="dynamiq-bench-")
    out = os.path.join(tmp, "rows.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, world, args, f"file://{tmp}/store", out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if not os.path.exists(out):
        raise SystemExit(f"world {world}: no results (exit codes {[p.exitcode for p in procs]})")
    return json.load(open(out))


def run_world_netbed(script: str, world: int, args, **netbed_kw) -> list:
    """Runs `script --worker OUT <this command's arguments>` on `world` ranks of the emulated
    cluster at args.netbed per link (netbed_kw: e.g. local_size); returns rank 0's rows."""
    import json
    import os
    import sys
    import tempfile

    from experiments.netbed import run

    tmp = tempfile.mkdtemp(prefix="dynamiq-bench-")
    out = os.path.join(tmp, "rows.json")
    argv = ["--worker", out] + sys.argv[1:]
    res = run(os.path.abspath(script), argv, world=world, rate=args.netbed, timeout=args.timeout, stream=0,
              **netbed_kw)
    if not os.path.exists(out):
        res.raise_for_failure()
        raise SystemExit(f"world {world}: no results")
    return json.load(open(out))
