"""How often a 2-rank Gloo DDP job aborts at exit, with and without freeing the model first.

    python experiments/probes/gloo_exit_abort.py --runs 25

Each run is a fresh `torch.multiprocessing.spawn` of 2 ranks: DDP over a
Linear(64, 64), 10 training steps (plain DDP, or with dynamiq.register),
10 small all-reduces, destroy_process_group(), exit. Variants:
  keep:  the model is still referenced when the process exits (a common script);
  free:  `del model; gc.collect()` before destroy_process_group().
A run fails when a rank dies by a signal ("terminate called without an active
exception": torch's Gloo threads free a work holding a Python tensor while
the interpreter finalizes; pytorch/pytorch#190489). Prints failures per variant.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile


def rank_main(rank: int, world: int, store: str, hook: str, free: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = DDP(torch.nn.Linear(64, 64))
    state = None
    if hook == "dynamiq":
        import dynamiq
        state = dynamiq.register(model, dynamiq.Config())
    for _ in range(10):
        model(torch.randn(8, 64)).sum().backward()
    for _ in range(10):
        t = torch.ones(4)
        dist.all_reduce(t)
    if free:
        del model, state
        gc.collect()
    dist.destroy_process_group()


def one_run(hook: str, free: bool) -> None:
    import torch.multiprocessing as mp

    store = os.path.join(tempfile.mkdtemp(prefix="exit-abort-"), "store")
    mp.spawn(rank_main, args=(2, store, hook, free), nprocs=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=25)
    p.add_argument("--hooks", nargs="+", default=["none", "dynamiq"])
    p.add_argument("--one", nargs=2, metavar=("HOOK", "FREE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        one_run(args.one[0], args.one[1] == "1")
        return
    print("| hook | variant | aborted runs |\n|---|---|---|")
    for hook in args.hooks:
        for free in (False, True):
            bad = 0
            for k in range(args.runs):
                r = subprocess.run([sys.executable, __file__, "--one", hook, "1" if free else "0"],
                                   capture_output=True, text=True, timeout=300)
                bad += r.returncode != 0
                print(f"  [{hook} {'free' if free else 'keep'}] run {k + 1}/{args.runs}: "
                      f"{'ABORT' if r.returncode else 'ok'}", file=sys.stderr, flush=True)
            print(f"| {hook} | {'free' if free else 'keep'} | {bad} / {args.runs} |", flush=True)


if __name__ == "__main__":
    main()
