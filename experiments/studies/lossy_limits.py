"""Where the lossy modes stop working well: magnitudes far from 1, tied statistics, log scales.

Each section runs `dynamiq.simulate` (the real C++ collective, in process, 2 ranks) on Gaussian
data scaled to the magnitude named on its lines and prints the error (vNMSE = ||result - exact
sum||^2 / ||exact sum||^2), the bits per coordinate and the width histogram. A randomized
differential test found these cases (2026-11-25); sections 2, 3 and 5 were fixed the same day
(tied statistics are split in SG order; tiny scales no longer overflow their reciprocal; bitsplit
ranges beyond FLT_MAX are quantised on quarters), 1 and 4 are the known limitations listed in the README ("Known limitations of the lossy modes"). Nothing here
is asserted (the C++ tests assert the fixes): it records the behaviour.

    python experiments/studies/lossy_limits.py [--out DIR]

Writes experiments/results/lossy_limits/ (`--out DIR` for a scratch run elsewhere).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments import results_io  # noqa: E402

import dynamiq  # noqa: E402

LINES = []


def say(*parts):
    """print, and keep the line for the results page."""
    line = " ".join(str(x) for x in parts)
    print(line, flush=True)
    LINES.append(line)


def vnmse(out, ref):
    return ((out.double() - ref).pow(2).sum() / ref.pow(2).sum()).item()


def gaussian_pair(numel, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g) for _ in range(2)]


def dynamiq_statistics_range():
    say("# 1. dynamiq, 5 bits: the allocator's float32 sum of squares underflows (RMS < ~1e-23: "
          "every SG at 2 bits) or saturates (RMS > ~1e18: saturated SGs tie, upgraded in SG order)")
    base = gaussian_pair(4096)
    cfg = dynamiq.Config(mode="dynamiq", bits=5.0, min_compress_numel=0)
    for scale in (1.0, 1e-20, 1e-24, 1e17, 1e19):
        ts = [b * scale for b in base]
        r, st = dynamiq.simulate(ts, cfg, return_stats=True)
        say(f"scale={scale:g} vNMSE={vnmse(r[0], ts[0].double() + ts[1].double()):.4f} "
              f"bits_per_coord={st[0]['bits_per_coord']:.3f} widths={st[0]['width_units']}")


def dynamiq_ties():
    say("# 2. dynamiq, 4.5 bits: super-groups with identical statistics (a pattern tiled 64 times); "
          "before the tie split every SG got 2 bits (vNMSE 0.68, 2.56 bits)")
    g = torch.Generator().manual_seed(0)
    pat = torch.randn(256, generator=g)
    cases = [("tiled", [pat.repeat(64), 2 * pat.repeat(64)]),
             ("iid", [torch.randn(16384, generator=g), 2 * torch.randn(16384, generator=g)])]
    for name, ts in cases:
        for alloc in ("fast", "exact"):
            cfg = dynamiq.Config(mode="dynamiq", bits=4.5, allocator=alloc, min_compress_numel=0)
            r, st = dynamiq.simulate(ts, cfg, return_stats=True)
            say(f"{name} allocator={alloc}: vNMSE={vnmse(r[0], ts[0].double() + ts[1].double()):.4f} "
                  f"bits_per_coord={st[0]['bits_per_coord']:.3f} widths={st[0]['width_units']}")


def tiny_values():
    say("# 3. tiny values: a scale below 2^-128 has no finite reciprocal (before the fix: bitsplit "
          "vNMSE 25 and relative bias 5 at 1e-37; DynamiQ biased for subnormal values). "
          "Mean of 64 calls: its relative bias should be ~sqrt(vNMSE / 64)")
    cases = [("bitsplit 8 bits", dict(mode="bitsplit", bits=8), (1e-30, 1e-36, 1e-37, 1e-39)),
             ("dynamiq 8-bit SGs", dict(mode="dynamiq", bits=9, widths=(8,)), (1e-30, 1e-37, 1e-39))]
    for name, kw, scales in cases:
        cfg = dynamiq.Config(min_compress_numel=0, **kw)
        for scale in scales:
            ts = [b * scale for b in gaussian_pair(256)]
            ref = ts[0].double() + ts[1].double()
            acc = torch.zeros(256, dtype=torch.float64)
            for ci in range(64):
                acc += dynamiq.simulate(ts, cfg, call_index=ci)[0].double()
            one = dynamiq.simulate(ts, cfg)[0]
            say(f"{name} scale={scale:g} vNMSE={vnmse(one, ref):.4g} relative bias of the "
                  f"64-call mean={((acc / 64 - ref).norm() / ref.norm()).item():.4g}")


def bitsplit_log_scales():
    say("# 4. bitsplit, 4 bits: log_scales=True clamps the scale to 2^-25.6 .. 2^25.5")
    base = gaussian_pair(4096)
    for scale in (1.0, 1e-7, 1e-8, 1e-10, 1e9, 1e10):
        ts = [b * scale for b in base]
        ref = ts[0].double() + ts[1].double()
        row = []
        for log in (False, True):
            cfg = dynamiq.Config(mode="bitsplit", bits=4, log_scales=log, min_compress_numel=0)
            row.append(f"log_scales={log}: vNMSE={vnmse(dynamiq.simulate(ts, cfg)[0], ref):.3g}")
        say(f"scale={scale:g}", *row)


def near_float_max():
    say("# 5. values near the float32 maximum: a bitsplit group whose range exceeds FLT_MAX overflowed "
          "its scale (128 non-finite outputs before the fix)")
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4096, generator=g), torch.randn(4096, generator=g)
    for name, ts in (("gaussian 3e37 (range ~2.5e38)", [a * 3e37, b * 3e36]),
                     ("3e38 and -3e38 in one group", [torch.cat([torch.tensor([3e38, -3e38]), a[2:] * 1e36]),
                                                      b * 1e36])):
        ref = ts[0].double() + ts[1].double()
        for kw in (dict(mode="bitsplit", bits=8), dict(mode="dynamiq", bits=5)):
            r = dynamiq.simulate(ts, dynamiq.Config(min_compress_numel=0, **kw))[0]
            bad = int((~torch.isfinite(r)).sum())
            err = f"vNMSE={vnmse(r, ref):.3g}" if bad == 0 else "vNMSE=n/a"
            say(f"{name} {kw['mode']}: non-finite outputs={bad} {err}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="study folder to write instead of experiments/results/lossy_limits")
    args = p.parse_args(argv)
    run = results_io.Run("lossy_limits", "Where the lossy modes stop working well", script=__file__, argv=argv,
                         out=args.out)
    dynamiq_statistics_range()
    dynamiq_ties()
    tiny_values()
    bitsplit_log_scales()
    near_float_max()
    print("[lossy_limits]", run.write("lossy_limits", "```\n" + "\n".join(LINES) + "\n```", data={"lines": LINES}))


if __name__ == "__main__":
    main()
