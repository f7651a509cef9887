"""Hugging Face Accelerate with dynamiq's DDP comm hook.

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_ddp.py --cpu   # 2 CPU processes (Gloo)
    accelerate launch --multi_gpu --num_processes 8 examples/accelerate_ddp.py         # 8 GPUs (NCCL)
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_ddp.py --cpu --check-resume

`accelerator.prepare` wraps the model in DistributedDataParallel; dynamiq's hook is then
registered on that model in torch's convention (`model.register_comm_hook(state,
dynamiq.comm_hook)`; `dynamiq.register(model, config)` is the same in one call).
`accelerator.register_for_checkpointing(state)` puts the hook's state (sequence number,
allocator state, config) into `accelerator.save_state` and `load_state`.

`--check-resume` saves the state halfway, trains on, loads the saved state and trains the
second half again: the weights come out bit for bit the same, because the hook's random
stream and allocator state were restored with the model and optimizer.
(`--multi_gpu` is what makes `accelerate launch` start several local processes; with
`--cpu` the script asks Accelerate for CPU processes on Gloo. Tested with accelerate
1.15.0, docs/integrations.md.)
"""

import argparse
import hashlib
import json
import os
import shutil
import tempfile

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import dynamiq


def make_data(n: int = 4096, dim: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, 10, generator=g)).argmax(dim=1)  # a linear teacher's classes
    return TensorDataset(x, y)


def weights_sha256(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="CPU processes on Gloo")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--mode", default="dynamiq", choices=dynamiq.available_modes())
    ap.add_argument("--bits", type=float, default=None, help="the mode's bits (default: the mode's own)")
    ap.add_argument("--print-every", type=int, default=5, help="print state.summary() every N steps (0: never)")
    ap.add_argument("--check-resume", action="store_true", help="save halfway, reload, redo the second half, compare")
    ap.add_argument("--out", help="folder for one JSON per rank (hook state, totals, weight hashes)")
    args = ap.parse_args()

    accelerator = Accelerator(cpu=args.cpu)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(make_data(), batch_size=32, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    state = dynamiq.HookState(dynamiq.Config(mode=args.mode, **({} if args.bits is None else {"bits": args.bits})))
    if isinstance(model, DistributedDataParallel):  # (one process: no DDP, nothing to compress)
        model.register_comm_hook(state, dynamiq.comm_hook)
    accelerator.register_for_checkpointing(state)

    batches = [b for _, b in zip(range(args.steps), loader)]

    def train(first: int, last: int) -> None:
        for i in range(first, last):
            x, y = batches[i]
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            if args.print_every and state.step % args.print_every == 0 and accelerator.is_main_process:
                print(f"loss {loss.item():.4f} | {state.summary()}", flush=True)

    result = {"rank": accelerator.process_index, "world": accelerator.num_processes}
    if args.check_resume:
        half = args.steps // 2
        # one folder for every rank (on a cluster: a shared file system): rank 0's
        tmp = [tempfile.mkdtemp(prefix="dynamiq-accelerate-") if accelerator.is_main_process else None]
        broadcast_object_list(tmp)
        ckpt = os.path.join(tmp[0], "ckpt")
        train(0, half)
        accelerator.save_state(ckpt)
        train(half, args.steps)
        result["first_pass"] = {"sha256": weights_sha256(model), "state": state.state_dict()}
        accelerator.load_state(ckpt)  # model, optimizer and the hook's state as they were at `half`
        result["reloaded_step"] = state.step
        train(half, args.steps)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(tmp[0])
        same = weights_sha256(model) == result["first_pass"]["sha256"]
        if accelerator.is_main_process:
            print(f"second half after reloading: {'bit for bit the same weights' if same else 'DIFFERENT weights'}")
    else:
        train(0, args.steps)
    result.update(sha256=weights_sha256(model), state=state.state_dict(), totals=state.totals,
                  world_size=state.world_size)
    if accelerator.is_main_process:
        print(f"this rank sent {state.totals['bytes_sent']} bytes in {state.totals['buckets']} buckets "
              f"{state.totals['paths']}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{accelerator.process_index}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
