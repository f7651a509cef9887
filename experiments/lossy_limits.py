"""Where the lossy modes stop working well: magnitudes far from 1, tied statistics, log scales.

Each section runs `dynamiq.simulate` (the real C++ collective, in process, 2 ranks) on Gaussian
data scaled to the magnitude named on its lines and prints the error (vNMSE = ||result - exact
sum||^2 / ||exact sum||^2), the bits per coordinate and the width histogram. These are the known
limitations listed in the README ("Known limitations of the lossy modes"); a randomized
differential test found them (2026-11-25). Nothing here is asserted: it records the behaviour.

    python experiments/lossy_limits.py > experiments/results/lossy_limits.txt
"""

import torch

import dynamiq


def vnmse(out, ref):
    return ((out.double() - ref).pow(2).sum() / ref.pow(2).sum()).item()


def gaussian_pair(numel, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g) for _ in range(2)]


def dynamiq_statistics_range():
    print("# 1. dynamiq, 5 bits: the allocator's float32 sum of squares underflows (RMS < ~1e-23) "
          "or saturates (RMS > ~1e18)")
    base = gaussian_pair(4096)
    cfg = dynamiq.Config(mode="dynamiq", bits=5.0, min_compress_numel=0)
    for scale in (1.0, 1e-20, 1e-24, 1e17, 1e19):
        ts = [b * scale for b in base]
        r, st = dynamiq.simulate(ts, cfg, return_stats=True)
        print(f"scale={scale:g} vNMSE={vnmse(r[0], ts[0].double() + ts[1].double()):.4f} "
              f"bits_per_coord={st[0]['bits_per_coord']:.3f} widths={st[0]['width_units']}")


def dynamiq_ties():
    print("# 2. dynamiq, 4.5 bits: super-groups with identical statistics all get the same width")
    g = torch.Generator().manual_seed(0)
    pat = torch.randn(256, generator=g)
    cases = [("tiled", [pat.repeat(64), 2 * pat.repeat(64)]),
             ("iid", [torch.randn(16384, generator=g), 2 * torch.randn(16384, generator=g)])]
    for name, ts in cases:
        for alloc in ("fast", "exact"):
            cfg = dynamiq.Config(mode="dynamiq", bits=4.5, allocator=alloc, min_compress_numel=0)
            r, st = dynamiq.simulate(ts, cfg, return_stats=True)
            print(f"{name} allocator={alloc}: vNMSE={vnmse(r[0], ts[0].double() + ts[1].double()):.4f} "
                  f"bits_per_coord={st[0]['bits_per_coord']:.3f} widths={st[0]['width_units']}")


def bitsplit_tiny():
    print("# 3. bitsplit, 8 bits: the group scale's reciprocal overflows for ranges below ~1e-36 "
          "(mean of 64 calls shows the bias)")
    for scale in (1e-30, 1e-36, 1e-37):
        ts = [b * scale for b in gaussian_pair(256)]
        ref = ts[0].double() + ts[1].double()
        cfg = dynamiq.Config(mode="bitsplit", bits=8, min_compress_numel=0)
        acc = torch.zeros(256, dtype=torch.float64)
        for ci in range(64):
            acc += dynamiq.simulate(ts, cfg, call_index=ci)[0].double()
        one = dynamiq.simulate(ts, cfg)[0]
        print(f"scale={scale:g} vNMSE={vnmse(one, ref):.4g} "
              f"relative bias of the 64-call mean={((acc / 64 - ref).norm() / ref.norm()).item():.4g}")


def bitsplit_log_scales():
    print("# 4. bitsplit, 4 bits: log_scales=True clamps the scale to 2^-25.6 .. 2^25.5")
    base = gaussian_pair(4096)
    for scale in (1.0, 1e-7, 1e-8, 1e-10, 1e9, 1e10):
        ts = [b * scale for b in base]
        ref = ts[0].double() + ts[1].double()
        row = []
        for log in (False, True):
            cfg = dynamiq.Config(mode="bitsplit", bits=4, log_scales=log, min_compress_numel=0)
            row.append(f"log_scales={log}: vNMSE={vnmse(dynamiq.simulate(ts, cfg)[0], ref):.3g}")
        print(f"scale={scale:g}", *row)


if __name__ == "__main__":
    dynamiq_statistics_range()
    dynamiq_ties()
    bitsplit_tiny()
    bitsplit_log_scales()
