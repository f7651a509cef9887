"""Plain DDP under torchrun with dynamiq's comm hook; a summary line per step and TensorBoard scalars.

    torchrun --standalone --nproc_per_node 2 examples/torchrun_ddp.py                 # CPU processes, Gloo
    torchrun --standalone --nproc_per_node 2 examples/torchrun_ddp.py --tensorboard runs/dynamiq
    tensorboard --logdir runs                                                         # the dynamiq/... scalars
    torchrun --standalone --nproc_per_node 8 examples/torchrun_ddp.py --backend nccl  # GPUs

The hook's state is made before the process group, as torch's comm-hook convention allows,
and registered with `model.register_comm_hook(state, dynamiq.comm_hook)`. After each step
`state.summary()` is one line on what the step sent, and `state.scalars()` the same numbers
by name, which rank 0 writes to TensorBoard (`torch.utils.tensorboard`; needs the
`tensorboard` package: without it the example says so and trains on without).
"""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamiq


def batch(rank: int, step: int, dim: int = 32):
    """This rank's batch of a fixed regression task (a different shard per rank)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, dim, generator=g)
    w = torch.linspace(-1, 1, dim)
    return x, torch.sin(x @ w).unsqueeze(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="gloo", help="gloo (CPU tensors) or nccl (one GPU per process)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--mode", default="dynamiq", choices=dynamiq.available_modes())
    ap.add_argument("--bits", type=float, default=None, help="the mode's bits (default: the mode's own)")
    ap.add_argument("--print-every", type=int, default=5, help="print state.summary() every N steps (0: never)")
    ap.add_argument("--tensorboard", metavar="DIR", help="write state.scalars() to TensorBoard here (rank 0)")
    ap.add_argument("--out", help="folder for one JSON per rank (hook state, totals, weight hash)")
    args = ap.parse_args()

    state = dynamiq.HookState(dynamiq.Config(mode=args.mode, **({} if args.bits is None else {"bits": args.bits})))  # no process group yet
    dist.init_process_group(args.backend)  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank = dist.get_rank()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    model.register_comm_hook(state, dynamiq.comm_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    writer = None
    if args.tensorboard and rank == 0:
        try:
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(args.tensorboard)
        except ImportError:  # torch.utils.tensorboard needs the tensorboard package
            print("tensorboard is not installed (pip install tensorboard): no TensorBoard scalars", flush=True)

    for step in range(args.steps):
        x, y = (t.to(device) for t in batch(rank, step))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if writer is not None:  # this rank's numbers; every rank sends about as much
            writer.add_scalar("loss", loss.item(), global_step=state.step)
            for name, value in state.scalars().items():
                writer.add_scalar(name, value, global_step=state.step)
        if rank == 0 and args.print_every and state.step % args.print_every == 0:
            print(f"loss {loss.item():.4f} | {state.summary()}", flush=True)
    if writer is not None:
        writer.close()

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "state": state.state_dict(), "totals": state.totals,
                       "world_size": state.world_size, "tensorboard": writer is not None,
                       "sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
