"""A short DDP training run with dynamiq: a tiny byte-level transformer LM on
text that ships with CPython (the pydoc topics), local CPU workers over
Gloo (2 by default). No downloads.

    python -m dynamiq.demo                      # 2 workers, mode dynamiq, 5 bits, ring
    python -m dynamiq.demo --world 4 --mode none --steps 50

Prints per-step loss and time on rank 0. The model and corpus are also used by
experiments/ (vnmse.py, train.py).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- data -------------------------------------------------------------------------
def corpus() -> torch.Tensor:
    """CPython's pydoc topics (English prose and code, ~800 KB) as a uint8 tensor."""
    from pydoc_data import topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).clone()


def get_batch(data: torch.Tensor, rank: int, step: int, batch: int, ctx: int, split: str = "train"):
    """Deterministic batch for (rank, step): the first 90 % of the corpus trains, the rest validates."""
    n = data.numel()
    lo, hi = (0, int(n * 0.9)) if split == "train" else (int(n * 0.9), n)
    g = torch.Generator().manual_seed(1_000_003 * step + 7919 * rank + (0 if split == "train" else 17))
    starts = torch.randint(lo, hi - ctx - 1, (batch,), generator=g)
    idx = starts[:, None] + torch.arange(ctx + 1)[None, :]
    seq = data[idx].long()
    return seq[:, :-1], seq[:, 1:]


# ---- model ------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Byte-level causal transformer (vocabulary 256)."""

    def __init__(self, d: int = 128, layers: int = 2, heads: int = 4, ctx: int = 64) -> None:
        super().__init__()
        self.ctx = ctx
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), 1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, 256).float(), y.reshape(-1))


# ---- the run ----------------------------------------------------------------------
def _worker(rank: int, world: int, args: argparse.Namespace, store: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dynamiq

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = TinyGPT(d=args.dim, layers=args.layers, ctx=args.ctx)
    ddp = DDP(model)
    kw = {} if args.bits is None else {"bits": args.bits}  # None: the mode's default
    cfg = dynamiq.Config(mode=args.mode, topology=args.topology, seed=args.seed, **kw)
    state = dynamiq.register(ddp, cfg)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    data = corpus()
    nparams = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"dynamiq demo: {world} workers (Gloo, CPU), TinyGPT {nparams / 1e6:.2f} M params, "
              f"config {cfg.mode}/{cfg.topology}" + (f" bits={cfg.bits}" if cfg.bits is not None else ""),
              flush=True)
    t_start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = get_batch(data, rank, step, args.batch, args.ctx)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(ddp, x, y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world
        if rank == 0:
            st = state.last_step_stats
            sent = sum(s["bytes_sent"] + s["meta_bytes_sent"] for s in st)
            # bits per coordinate this rank sent, counting one all-reduce as 2 (n - 1) / n
            # copies of the bucket (what every rank of a ring sends; lossless's
            # bits_per_coord is only its upper bound, the raw width)
            numel = sum(s["numel"] for s in st)
            bits = 8.0 * sum(s["bytes_sent"] for s in st) / max(1, numel * 2 * (world - 1) / world) \
                if world > 1 else 0.0
            paths = sorted({s["path"] for s in st})
            print(f"step {step:4d}  loss {mean_loss.item():.4f}  time {dt * 1e3:7.1f} ms  "
                  f"sent {sent / 1e6:6.2f} MB  {bits:5.2f} bits/coord  {','.join(paths)}", flush=True)
    if rank == 0:
        total = time.perf_counter() - t_start
        print(f"done: {args.steps} steps in {total:.1f} s; final loss {mean_loss.item():.4f} "
              f"(uniform bytes: {math.log(256):.3f})", flush=True)
    # Free the DDP model (and the hook state that refers to it) while the
    # interpreter is fully alive: left to the garbage collector at exit, torch's
    # Gloo worker threads may free a work holding a Python tensor during
    # finalization, cannot take the GIL, and the process aborts ("terminate called
    # without an active exception"; a plain DDP script without dynamiq did so in
    # 5 runs of 25 here, 0 of 25 with this; pytorch/pytorch#190489).
    del ddp, model, opt, state
    gc.collect()
    dist.destroy_process_group()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A short DDP training run with dynamiq: a tiny byte-level "
                                "transformer LM, local CPU workers over Gloo, no downloads.")
    p.add_argument("--world", type=int, default=2,
                   help="local worker processes (default 2; 1-16; more than the CPU count just runs slower)")
    p.add_argument("--steps", type=int, default=40, help="training steps (>= 1)")
    p.add_argument("--mode", default="dynamiq", help="a mode of dynamiq.available_modes() (default dynamiq)")
    p.add_argument("--topology", default="ring",
                   help="a schedule of dynamiq.available_topologies(compositions=False) (default ring)")
    p.add_argument("--bits", type=float, default=None,
                   help="the mode's bits (its default when not given: dynamiq 5.0, bitsplit 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)
    if not 1 <= args.world <= 16:
        p.error(f"--world must be in 1..16, got {args.world}")
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    import dynamiq

    if args.mode not in dynamiq.available_modes():
        p.error(f"mode {args.mode!r} is not available in this build (available: {dynamiq.available_modes()})")
    schedules = dynamiq.available_topologies(compositions=False)
    if args.topology not in schedules:
        p.error(f"topology {args.topology!r} is not a schedule of this build (available: {schedules})")
    from dynamiq.config import mode_params

    if args.bits is not None and "bits" not in mode_params(args.mode):
        p.error(f"--bits: mode {args.mode!r} takes no bit budget (its parameters: "
                f"{', '.join(mode_params(args.mode)) or 'none'})")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch.multiprocessing as mp

    store = os.path.join(tempfile.mkdtemp(prefix="dynamiq-demo-"), "store")
    mp.spawn(_worker, args=(args.world, args, store), nprocs=args.world)


if __name__ == "__main__":
    main()
