"""PyTorch Lightning with dynamiq's DDP comm hook: 2 processes on the CPU (Gloo).

    python examples/lightning_ddp.py                      # 2 processes, 20 steps, dynamiq at 5 bits
    python examples/lightning_ddp.py --devices 4 --bits 4 --steps 100 --print-every 10
    python examples/lightning_ddp.py --save ckpt.pt      # then resume: --resume ckpt.pt --steps 40
    python examples/lightning_ddp.py --accelerator gpu    # GPUs (NCCL): the same hook

Lightning starts the other processes itself (it runs this script again for each rank).
The hook's state is made before any process group exists and passed to DDPStrategy as
torch's comm-hook convention has it; `DynamiqCallback` registers the hook on the CPU
(Lightning 2.6.6 registers comm hooks on CUDA devices only), keeps the hook's state in
Lightning's checkpoints, and logs `state.scalars()` with the module's loggers.
Tested with lightning 2.6.6 (docs/integrations.md).
"""

import argparse
import hashlib
import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import dynamiq
from dynamiq.lightning import DynamiqCallback


class Regressor(pl.LightningModule):
    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def dataset(n: int = 4096, dim: int = 32) -> TensorDataset:
    """A smooth target of random inputs (the same on every rank; Lightning's sampler splits it)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, generator=g)
    y = torch.tanh(x @ w / dim ** 0.5) + 0.05 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps in all (max_steps)")
    ap.add_argument("--mode", default="dynamiq", choices=dynamiq.available_modes())
    ap.add_argument("--bits", type=float, default=None, help="the mode's bits (default: the mode's own)")
    ap.add_argument("--print-every", type=int, default=5, help="print state.summary() every N steps (0: never)")
    ap.add_argument("--save", help="write a Lightning checkpoint (with the hook's state) here at the end")
    ap.add_argument("--resume", help="resume from this checkpoint (trainer.fit(ckpt_path=...))")
    ap.add_argument("--out", help="folder for one JSON per rank: the hook's state, totals, a hash of the weights")
    args = ap.parse_args()

    pl.seed_everything(0, verbose=False)
    state = dynamiq.HookState(dynamiq.Config(mode=args.mode, **({} if args.bits is None else {"bits": args.bits})))  # no process group yet
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=args.devices, max_steps=args.steps,
        strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=dynamiq.comm_hook),
        callbacks=[DynamiqCallback(print_every_n_steps=args.print_every)],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Regressor()
    trainer.fit(model, DataLoader(dataset(), batch_size=32, shuffle=True), ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    if trainer.is_global_zero:
        print(f"loss {float(trainer.callback_metrics['loss']):.4f} after {trainer.global_step} steps; "
              f"this rank sent {state.totals['bytes_sent']} bytes in {state.totals['buckets']} buckets "
              f"{state.totals['paths']}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        with open(os.path.join(args.out, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"rank": trainer.global_rank, "world": trainer.world_size, "global_step": trainer.global_step,
                       "state": state.state_dict(), "totals": state.totals, "world_size": state.world_size,
                       "logged": sorted(k for k in trainer.callback_metrics if k.startswith("dynamiq/")),
                       "weights_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest()}, f)


if __name__ == "__main__":
    main()
