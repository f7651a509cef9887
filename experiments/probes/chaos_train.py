"""The DDP job of the chaos runs (experiments/probes/chaos.py, tests/python/test_chaos.py): one
worker of a torchrun job that checkpoints and resumes.

Every worker trains the same small MLP with SGD + momentum on batches drawn from (rank, step), with
dynamiq's hook in --mode. Every --ckpt-every steps rank 0 writes a checkpoint of the model, the
optimizer and the hook state (`HookState.state_dict()`: config, step, sequence number, allocator
state) to --dir/ckpt-<step>.pt (atomically: a temporary file, then a rename). At start every
worker loads the newest checkpoint in --dir, if any, and continues from its step; torchrun's
elastic restart (--max-restarts) therefore resumes a failed job from its last checkpoint.

Faults the worker makes itself (only in the job's first attempt):
  --kill-rank R --kill-step S   rank R SIGKILLs itself in the backward pass of step S, after the
                                hook has started the step's first bucket (its peers are inside a
                                collective with it).
Faults made from outside (chaos.py: a link down, a slow link) need to know where the job is:
every worker appends "step <n>" to --dir/progress-<rank> after each step.

At the end rank r writes --dir/final-<r>.pt (the parameters) and --dir/final-<r>.json (their
SHA-256, the step the run started from, the restart count)."""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamiq


def make_model(width: int):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    return torch.randn(64, 128, generator=g), torch.randint(0, 10, (64,), generator=g)


def digest(params) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().contiguous().view(-1).numpy().tobytes())
    return h.hexdigest()


def latest_checkpoint(d: str):
    found = [(int(m.group(1)), f) for f in glob.glob(os.path.join(d, "ckpt-*.pt"))
             if (m := re.search(r"ckpt-(\d+)\.pt$", f))]
    return max(found) if found else (0, None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--mode", default="dynamiq")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds of idle time per step (pacing)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The process group's store, with a prefix per attempt. torchrun (2.14.1, c10d rendezvous) gives
    # every attempt the agent's store of the first one, where the Gloo addresses of the dead workers
    # are still found (init_process_group("gloo") then times out connecting to them), and
    # TORCHELASTIC_RESTART_COUNT counts only the restarts of the worker's own agent: an agent whose
    # workers were healthy restarts them with the count unchanged. The attempt number comes from a
    # counter per rank in the store instead (every attempt starts one worker per rank).
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=(rank == 0 and not agent_store), timeout=timedelta(seconds=60))
    attempt = store.add(f"chaos_train/attempts/{rank}", 1) - 1
    dist.init_process_group("gloo", store=dist.PrefixStore(f"chaos_train/attempt{attempt}", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))

    model = DDP(make_model(a.width), bucket_cap_mb=0.25)
    state = dynamiq.register(model, dynamiq.Config(mode=a.mode))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    start, path = latest_checkpoint(a.dir)
    if path is not None:
        ck = torch.load(path, weights_only=False)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        state.load_state_dict(ck["hook"])
        assert ck["step"] == start
    print(f"[chaos_train] rank {rank}/{world} mode {a.mode} attempt {attempt} (agent restarts {restart}): "
          f"starting at step {start}", flush=True)

    if attempt == 0 and rank == a.kill_rank:
        def die(grad):
            if die.step == a.kill_step:
                time.sleep(0.05)  # the first bucket's collective is under way
                os.kill(os.getpid(), signal.SIGKILL)
            return grad
        die.step = -1
        model.module[0].weight.register_hook(die)  # the last gradient of the backward pass

    prog = open(os.path.join(a.dir, f"progress-{rank}"), "a")
    for step in range(start, a.steps):
        if a.kill_rank >= 0 and attempt == 0 and rank == a.kill_rank:
            die.step = step
        x, y = batch(rank, step)
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        prog.write(f"step {step + 1} {time.time():.3f}\n")
        prog.flush()
        if a.step_sleep:
            time.sleep(a.step_sleep)
        if (step + 1) % a.ckpt_every == 0 and step + 1 < a.steps and rank == 0:
            tmp = os.path.join(a.dir, f".ckpt-{step + 1}.tmp")
            torch.save({"step": step + 1, "model": model.module.state_dict(), "optimizer": opt.state_dict(),
                        "hook": state.state_dict()}, tmp)
            os.replace(tmp, os.path.join(a.dir, f"ckpt-{step + 1}.pt"))
        if (step + 1) % a.ckpt_every == 0:
            dist.barrier()  # nobody runs ahead of a checkpoint that is not written yet
    params = [p.detach().clone() for p in model.module.parameters()]
    torch.save(params, os.path.join(a.dir, f"final-{rank}.pt"))
    with open(os.path.join(a.dir, f"final-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "mode": a.mode, "start_step": start, "attempt": attempt, "restart_count": restart,
                   "steps": a.steps, "digest": digest(params), "hook_step": state.step, "hook_seq": state.seq}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
