"""Running a function on N local processes joined by a process group (Gloo; NCCL for the GPU tests).

`run_ranks(fn, world, *args)` starts one process per rank, initialises
torch.distributed over a FileStore (no ports to collide), runs
`fn(rank, world, *args)` and returns the per-rank results. A rank that raises
makes `run_ranks` raise with that rank's traceback; ranks that do not finish
within `timeout` seconds are killed and reported, so no test can hang.

Rank processes come from a fork server that has imported torch and dynamiq
once (multiprocessing's "forkserver" start method), not from a fresh
interpreter each ("spawn"): importing torch and dynamiq costs ~2.5 s of CPU
per process, and every rank of every call paid it (the suite took 175 s
instead of 328 s once they no longer did). The fork server is a clean process (it
imports, it never runs a collective or starts a thread pool), and every
setting the library reads from the environment (DYNAMIQ_CPU_THREADS,
DYNAMIQ_CPU_ISA, DYNAMIQ_ORDERED_POSTING) is read at first use, after
`_entry` has applied the test's `env`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, List


class RankFailure(AssertionError):
    pass


# torch.distributed.fsdp (and torch._dynamo, which it imports) cost ~4 s per rank to import: the FSDP2 tests
_PRELOAD = ["torch", "torch.distributed", "numpy", "dynamiq", "dist_utils", "torch.distributed.fsdp", "dynamiq.fsdp"]
_context = None


def _mp_context():
    global _context
    if _context is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _context = ctx
    return _context


class _PortableTensor:
    """A tensor as bytes: torch's shared-memory pickling breaks when the
    sending process exits before the parent reads the queue."""

    def __init__(self, t):
        import torch

        t = t.detach().cpu().contiguous()
        self.dtype = str(t.dtype).replace("torch.", "")
        self.shape = tuple(t.shape)
        self.data = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""

    def restore(self):
        import torch

        dt = getattr(torch, self.dtype)
        buf = torch.frombuffer(bytearray(self.data), dtype=torch.uint8) if self.data else torch.empty(0, dtype=torch.uint8)
        return buf.view(dt).reshape(self.shape).clone()


def _portable(obj, restore=False):
    import torch

    if restore and isinstance(obj, _PortableTensor):
        return obj.restore()
    if not restore and isinstance(obj, torch.Tensor):
        return _PortableTensor(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_portable(o, restore) for o in obj)
    if isinstance(obj, dict):
        return {k: _portable(v, restore) for k, v in obj.items()}
    return obj


def _entry(fn, rank, world, store_path, pg_timeout, q, args, env, backend, eager):
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        kw = {}
        if "nccl" in backend or (backend == "" and torch.cuda.is_available()):  # one GPU per rank
            torch.cuda.set_device(rank)
            if eager:  # communicators made at init: NCCL then runs all P2P on one stream per rank
                kw["device_id"] = torch.device("cuda", rank)
        # backend "": init_process_group() without one (torch picks per device type)
        dist.init_process_group(backend or None, init_method=f"file://{store_path}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=pg_timeout), **kw)
        try:
            result = fn(rank, world, *args)
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
        q.put((rank, "ok", _portable(result)))
    except BaseException:  # noqa: BLE001
        q.put((rank, "err", traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 180.0,
              pg_timeout: float = 60.0, env: dict | None = None, allow_failure: bool = False,
              backend: str = "gloo", eager: bool = False) -> List[Any]:
    """Runs fn(rank, world, *args) on `world` processes; returns results by rank.

    With allow_failure=True, a failing rank's entry is ("error", message)
    instead of raising. backend: the process group's ("nccl": rank r on GPU r;
    eager=True passes device_id so the communicators are made at init; "": none
    given, torch's default per device type).
    """
    ctx = _mp_context()
    q = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="dynamiq-test-")
    store = os.path.join(tmp, "store")
    env = dict({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}, **(env or {}))
    procs = [ctx.Process(target=_entry, args=(fn, r, world, store, pg_timeout, q, args, env, backend, eager),
                         daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict = {}
    deadline = time.monotonic() + timeout

    def record(rank, status, payload):
        results[rank] = _portable(payload, restore=True) if status == "ok" else ("error", payload)
        if status != "ok" and not allow_failure:
            raise RankFailure(f"rank {rank} failed:\n{payload}")

    try:
        while len(results) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world)) - set(results))
                raise RankFailure(f"ranks {missing} did not finish within {timeout} s")
            try:
                record(*q.get(timeout=min(remaining, 1.0)))
                continue
            except queue.Empty:
                pass
            # A rank that died without reporting (e.g. killed) counts as failed,
            # once its queued message (if any) has had time to arrive.
            for r, p in enumerate(procs):
                if r in results or p.is_alive():
                    continue
                try:
                    record(*q.get(timeout=2.0))
                except queue.Empty:
                    record(r, "err", f"rank {r} exited with code {p.exitcode} without a result")
                break
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [results[r] for r in range(world)]
