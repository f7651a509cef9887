"""A soak run of the DDP hook: many steps per mode on one set of rank processes, sampling what a
leak would grow (shared by tests/python/test_soak.py and experiments/probes/soak.py).

`soak_rank(rank, world, modes, steps)` trains a fresh DDP model (about 85k parameters, several
buckets) for `steps` SGD-with-momentum steps in each mode, one mode after the other, and returns
per mode: the resident set size (RSS) after every step, a SHA-256 of the final parameters' bytes
(replicas must agree bit for bit), and the counts of open file descriptors (/proc/self/fd) and
threads (/proc/self/task) at the end of the warm-up (`warmup` steps), after the last step, and after
the mode's model, optimizer and hook state were dropped.
"""

from __future__ import annotations

import gc
import hashlib
import os
import time

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def make_model(seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))


def batch(rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def param_digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(-1).numpy().tobytes())
    return h.hexdigest()


def soak_rank(rank: int, world: int, modes, steps: int, warmup: int = 50, progress: bool = False) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dynamiq

    out = {"fds_start": open_fds(), "threads_start": threads(), "modes": {}}
    for mode in modes:
        model = DDP(make_model(), bucket_cap_mb=0.2)  # ~340 KB of float32 gradients: 2 buckets
        # mode bounded has no default bound: a relative one of 1e-3 of the value range
        extra = {"error_bound_rel": 1e-3} if mode == "bounded" else {}
        state = dynamiq.register(model, dynamiq.Config(mode=mode, **extra))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        rss = []
        warm_counts = None
        t0 = time.perf_counter()
        for step in range(steps):
            x, y = batch(rank, step)
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            rss.append(rss_bytes())
            if step + 1 == warmup:
                warm_counts = (open_fds(), threads())
            if progress and rank == 0 and (step + 1) % max(1, steps // 20) == 0:
                print(f"[soak] {mode}: step {step + 1}/{steps}, RSS {rss[-1] / 2**20:.1f} MiB", flush=True)
        secs = time.perf_counter() - t0
        end_counts = (open_fds(), threads())
        finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        digest = param_digest(model.module)
        hook_steps = state.step
        del model, state, opt, x, y
        gc.collect()
        out["modes"][mode] = {"rss": rss, "digest": digest, "finite": finite, "hook_steps": hook_steps,
                              "seconds": secs, "warm_counts": warm_counts, "end_counts": end_counts,
                              "fds": open_fds(), "threads": threads()}
    return out
