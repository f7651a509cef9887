"""What bitsplit's `bits` costs on the wire, and what it buys: bits per value
sent (all metadata included) and vNMSE of a 2-rank two-step all-reduce, per
width, dtype and spike-reserve setting.

    python experiments/studies/bitsplit_wire.py [--numel 262144] [--out DIR]   # ~1 min

Writes experiments/results/bitsplit_wire/ (`--out DIR` for a scratch run elsewhere).

`bits` is the code width; the wire also carries a scale and a zero per group
(32 values at 2-4 bits, 128 at 5-8) and, with spike reserving (on by default at
2 and 3 bits, as in the paper), each group's min and max in the bucket's dtype
with an int8 index each. Through `dynamiq.simulate` (the real codec and wire
format); bits per value from the plan's wire size of one copy of the bucket.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402

import dynamiq  # noqa: E402


def data(kind: str, rank: int, numel: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    z = torch.randn(numel, generator=g)
    if kind == "gaussian":
        return z
    # Student-t, 3 degrees of freedom
    chi2 = sum(torch.randn(numel, generator=g) ** 2 for _ in range(3))
    return z / torch.sqrt(chi2 / 3)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=262144)
    p.add_argument("--out", default=None, help="study folder to write instead of experiments/results/bitsplit_wire")
    args = p.parse_args(argv)
    run = results_io.Run("bitsplit_wire", "bitsplit: wire cost and error per width", script=__file__, argv=argv,
                         out=args.out)
    headers = ["dtype", "bits", "spike_reserve", "bits sent / value", "vNMSE gaussian", "vNMSE student-t(3)"]
    rows, recs = [], []
    cases = [(dt, b, sr) for dt in (torch.float32, torch.bfloat16) for b in range(2, 9)
             for sr in ((None, False, True) if b <= 4 else (None,))]
    for i, (dt, b, sr) in enumerate(cases):
        cfg = dynamiq.Config(mode="bitsplit", bits=b, topology="twostep", spike_reserve=sr)
        cells = []
        sent = None
        for kind in ("gaussian", "heavy"):
            xs = [data(kind, r, args.numel).to(dt) for r in range(2)]
            ref = xs[0].double() + xs[1].double()
            out, st = dynamiq.simulate(xs, cfg, return_stats=True)
            assert st[0]["path"] == "compressed", st[0]
            sent = st[0]["bits_per_coord"]
            cells.append(float(((out[0].double() - ref) ** 2).sum() / (ref ** 2).sum()))
        label = {None: "default (" + ("on" if b <= 3 else "off") + ")", False: "off", True: "on"}[sr]
        rows.append([str(dt).replace("torch.", ""), str(b), label, f"{sent:.3f}", f"{cells[0]:.2e}", f"{cells[1]:.2e}"])
        recs.append({"dtype": rows[-1][0], "bits": b, "spike_reserve": label, "bits_per_value": sent,
                     "vnmse_gaussian": cells[0], "vnmse_student_t3": cells[1]})
        print(f"[{i + 1}/{len(cases)}] {rows[-1]}", flush=True)
    md = (f"2 ranks, two-step, {args.numel} values per rank, one call each (vNMSE = ||sum_hat - sum||^2 / "
          f"||sum||^2 against the float64 sum).\n\n" + benchlib.markdown_table(headers, rows) + "\n")
    print(md)
    print("[bitsplit_wire]", run.write("bitsplit_wire", md, data={"numel": args.numel, "rows": recs}))


if __name__ == "__main__":
    main()
