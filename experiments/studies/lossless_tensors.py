"""Lossless mode on real gradients, per tensor: achieved bits per exponent
next to the exponent entropy, float32 and bfloat16 (issue 5's report).

    python experiments/studies/lossless_tensors.py          # ~1 min on 2 cores
    python experiments/studies/lossless_tensors.py --steps 100 --captures 0 100 --out experiments/out/lossless_tensors

Gradients: the byte-level transformer LM of the other experiments
(dynamiq.demo.TinyGPT, d=128, 4 layers) trained with AdamW on CPython's pydoc
text by one worker; at each capture step every parameter's gradient is coded
with `dynamiq.lossless_stats` exactly as lossless mode codes one copy of a
bucket (blocks of `--block-bytes` raw bytes, the collective's default 1 MiB),
in float32 and cast to bfloat16. Whole-gradient rows code the concatenated
gradient in DDP's order (reverse parameter order), as one bucket.
Columns: ratio = wire bytes / raw bytes (headers, tables included); bits/exp =
achieved bits per coded exponent; H = order-0 entropy of the tensor's
exponents; Hb = mean per-block entropy (the bound for per-block tables).
Writes experiments/results/lossless_tensors/ (`--out DIR` for a scratch run elsewhere).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402

import dynamiq  # noqa: E402
from dynamiq.demo import TinyGPT, corpus, get_batch, lm_loss  # noqa: E402


def capture(steps: int, captures: list, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = TinyGPT(d=128, layers=4, ctx=64)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    data = corpus()
    out = {}
    t0 = time.time()
    for step in range(steps + 1):
        opt.zero_grad()
        loss = lm_loss(model, *get_batch(data, 0, step, 8, 64))
        loss.backward()
        if step in captures:
            out[step] = [(n, p.grad.detach().clone()) for n, p in model.named_parameters()]
            print(f"[grad] step {step:4d} loss {loss.item():.3f} captured ({time.time() - t0:.0f} s)", flush=True)
        if step == steps:
            break
        opt.step()
    return out


def row(name: str, g: torch.Tensor, block_bytes: int) -> tuple:
    cells, rec = [name, str(g.numel())], {"tensor": name, "numel": g.numel()}
    for dt in (torch.float32, torch.bfloat16):
        s = dynamiq.lossless_stats(g.to(dt).contiguous(), block_bytes=block_bytes)
        key = "fp32" if dt == torch.float32 else "bf16"
        rec[key] = s
        cells += [f"{s['ratio']:.4f}", f"{s['exponent_bits']:.3f}", f"{s['exponent_entropy']:.3f}",
                  f"{s['block_exponent_entropy']:.3f}"]
    return cells, rec


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--captures", type=int, nargs="+", default=[0, 100, 300])
    p.add_argument("--min-numel", type=int, default=4096, help="smaller tensors are left out of the per-tensor table")
    p.add_argument("--block-bytes", type=int, default=1 << 20)
    p.add_argument("--out", default=None,
                   help="study folder to write instead of experiments/results/lossless_tensors")
    args = p.parse_args(argv)
    run = results_io.Run("lossless_tensors", "Lossless mode on real gradients, per tensor", script=__file__,
                         argv=argv, out=args.out)

    grads = capture(args.steps, sorted(args.captures))
    headers = ["tensor", "numel", "fp32 ratio", "fp32 bits/exp", "fp32 H", "fp32 Hb",
               "bf16 ratio", "bf16 bits/exp", "bf16 H", "bf16 Hb"]
    whole, whole_recs = [], []
    last = max(grads)
    per_tensor, per_tensor_recs = [], []
    for step, named in sorted(grads.items()):
        flat = torch.cat([g.reshape(-1) for _, g in reversed(named)])  # DDP buckets: reverse order
        cells, rec = row(f"whole gradient, step {step}", flat, args.block_bytes)
        whole.append(cells)
        whole_recs.append(dict(rec, step=step))
        if step == last:
            for name, g in named:
                if g.numel() >= args.min_numel:
                    cells, rec = row(name, g.reshape(-1), args.block_bytes)
                    per_tensor.append(cells)
                    per_tensor_recs.append(dict(rec, step=step))
    md = (f"Whole gradient (one bucket, {whole_recs[0]['numel']} values) per capture step:\n\n"
          + benchlib.markdown_table(headers, whole)
          + f"\n\nPer tensor (>= {args.min_numel} values) at step {last}:\n\n"
          + benchlib.markdown_table(headers, per_tensor) + "\n")
    print(md)
    print("[lossless_tensors]", run.write("lossless_tensors", md,
                                          data={"whole": whole_recs, "per_tensor": per_tensor_recs}))


if __name__ == "__main__":
    main()
