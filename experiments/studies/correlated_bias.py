"""Correlated against independent rounding: bias and total error of the all-reduced sum per world size.

Correlated rounding (u = (pi + gamma) / n, pi a permutation shared by the ranks) is unbiased for
one rounding per rank, but a ring or butterfly hop rounds a partial sum whose value depends on
earlier hops' draws, which makes the result slightly biased. This measures how much, with
`dynamiq.simulate` (the real C++ collective in one process; bit-identical to a Gloo run, see
tests/python/test_modes_multiprocess.py::test_simulate_equals_real_run_dynamiq):

  * the same input (Student-t 3 with per-256 scale drift, 4096 elements per rank) reduced
    `calls` times, each call with fresh randomness (call_index keys it);
  * vNMSE = E||result - exact||^2 / ||exact||^2 and bias^2 = ||E[result] - exact||^2 / ||exact||^2,
    debiased for the finite number of calls (minus var / calls).

    python experiments/studies/correlated_bias.py [calls] [--out DIR]   # 2000 calls: ~1 h on 2 cores

Writes experiments/results/correlated_bias/ (`--out DIR` for a scratch run elsewhere).
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments import results_io  # noqa: E402

import dynamiq  # noqa: E402


def data(rank, numel=4096):
    g = torch.Generator().manual_seed(rank)
    z = torch.randn(numel, generator=g)
    chi2 = sum(torch.randn(numel, generator=g) ** 2 for _ in range(3))
    scale = torch.exp(torch.randn((numel + 255) // 256, generator=g)).repeat_interleave(256)[:numel]
    return z / torch.sqrt(chi2 / 3) * scale * 1e-3


def measure(world, topology, rounding, bits, calls):
    xs = [data(r) for r in range(world)]
    ref = torch.stack([x.double() for x in xs]).sum(0)
    cfg = dynamiq.Config(mode="dynamiq", bits=bits, topology=topology, rounding=rounding, min_compress_numel=0)
    acc = torch.zeros_like(ref)
    acc2 = torch.zeros_like(ref)
    for k in range(calls):
        e = dynamiq.simulate(xs, cfg, call_index=k)[0].double() - ref
        acc += e
        acc2 += e * e
    mean = acc / calls
    var = acc2 / calls - mean ** 2
    norm = float((ref ** 2).sum())
    mse = float(acc2.sum() / calls) / norm
    bias2 = float((mean ** 2).sum() - (var / (calls - 1)).sum()) / norm
    # standard error of the bias^2 estimate under zero bias: sqrt(2 sum (var/calls)^2) / norm
    se = float(torch.sqrt(2 * ((var / calls) ** 2).sum())) / norm
    return mse, bias2, se


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calls", type=int, nargs="?", default=400, help="calls per row")
    p.add_argument("--out", default=None, help="study folder to write instead of experiments/results/correlated_bias")
    args = p.parse_args(argv)
    calls = args.calls
    run = results_io.Run("correlated_bias", "Correlated vs independent rounding: bias and error of the all-reduced sum",
                         script=__file__, argv=argv, out=args.out)
    lines = [f"{calls} calls per row, Student-t 3 data with scale drift, 4096 elements per rank, "
             "DynamiQ default widths; bias^2 and vNMSE relative to ||exact sum||^2.", "",
             "| world | topology | bits | correlated vNMSE | its bias^2 (% of vNMSE) | bias^2 std. error "
             "| independent vNMSE | its bias^2 | correlated / independent |",
             "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    recs = []
    for world in (2, 3, 4, 8):
        for topology in ("ring", "butterfly"):
            for bits in (4.0, 5.0):
                t0 = time.time()
                mc, bc, se = measure(world, topology, "correlated", bits, calls)
                mi, bi, _ = measure(world, topology, "independent", bits, calls)
                lines.append(f"| {world} | {topology} | {bits:g} | {mc:.4e} | {bc:.2e} ({100 * bc / mc:.1f} %) "
                             f"| {se:.1e} | {mi:.4e} | {bi:.1e} | {mc / mi:.3f} |")
                recs.append({"world": world, "topology": topology, "bits": bits, "correlated_vnmse": mc,
                             "correlated_bias2": bc, "bias2_stderr": se, "independent_vnmse": mi,
                             "independent_bias2": bi})
                print(lines[-1], flush=True)
                print(f"  (row took {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    print("[correlated_bias]", run.write("correlated_bias", "\n".join(lines), data={"calls": calls, "rows": recs}))


if __name__ == "__main__":
    main()
