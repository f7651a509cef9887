"""FSDP2 (`fully_shard`) under torchrun with dynamiq's reduce-scatter and all-gather.

    torchrun --standalone --nproc_per_node 2 examples/fsdp2_train.py                 # CPU processes, Gloo
    torchrun --standalone --nproc_per_node 4 examples/fsdp2_train.py --mode lossless
    torchrun --standalone --nproc_per_node 8 examples/fsdp2_train.py --backend nccl  # GPUs

A small transformer block stack is sharded with `fully_shard` (each block, then the root),
then `dynamiq.fsdp.enable` gives every FSDPModule dynamiq's gradient reduce-scatter (in the
config's mode) and a lossless parameter all-gather. After training, every rank prints the
SHA-256 of the full (all-gathered) parameters: equal on every rank, and with `--mode lossless`
equal to the same run with `--mode none`.
"""

import argparse
import gc
import hashlib
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import dynamiq


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batch(rank: int, step: int, vocab: int = 256, seq: int = 32):
    """This rank's batch: a repeating pattern with noise (learnable, different per rank)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    start = torch.randint(0, vocab, (8, 1), generator=g)
    tokens = (start + 3 * torch.arange(seq + 1)) % vocab
    return tokens[:, :-1], tokens[:, 1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="gloo", help="gloo (CPU tensors) or nccl (one GPU per process)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mode", default="dynamiq", choices=dynamiq.available_modes())
    ap.add_argument("--bits", type=float, default=None, help="the mode's bits (default: the mode's own)")
    ap.add_argument("--all-gather", default="lossless", choices=["lossless", "none", "torch"],
                    help="parameter all-gather: dynamiq lossless, dynamiq none, or FSDP2's own")
    ap.add_argument("--print-every", type=int, default=5)
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same initial parameters on every rank
    model = TinyLM().to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    cfg = dynamiq.Config(mode=args.mode, **({} if args.bits is None else {"bits": args.bits}))
    state = dynamiq.fsdp.enable(model, cfg, all_gather=None if args.all_gather == "torch" else args.all_gather)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    for step in range(args.steps):
        x, y = (t.to(device) for t in batch(rank, step))
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and args.print_every and (step + 1) % args.print_every == 0:
            print(f"step {step + 1} loss {loss.item():.4f} | {state.summary()}", flush=True)

    full = [p.full_tensor().detach().reshape(-1).cpu() for p in model.parameters()]  # DTensor shards
    digest = hashlib.sha256(torch.cat(full).numpy().tobytes()).hexdigest()
    print(f"rank {rank}: parameters sha256 {digest[:16]}", flush=True)
    # Free what holds process groups and tensors before the interpreter exits: left
    # to finalization, torch's Gloo threads can free a collective's tensor then and
    # abort the process (pytorch/pytorch#190489; experiments/results/gloo_exit_abort).
    del model, opt, state, full
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
