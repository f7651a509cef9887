"""vNMSE of the all-reduced sum against world size n for ring, butterfly and
two-step, with the real codecs over the in-process transport
(`dynamiq.simulate`, the same C++ schedules and wire format as a real run).

    python experiments/studies/topology.py             # n = 2..64, default rows
    python experiments/studies/topology.py --worlds 2 4 8 --trials 2 --numel 65536 --out experiments/out/topology

Appendix B of the DynamiQ paper bounds the ring's MSE by O(n^3) and the
butterfly's by O(n^2) (a factor n slower); two-step quantises each
coordinate twice whatever n is. vNMSE = ||X_hat - X||^2 / ||X||^2 with X the
exact (float64) sum; inputs are i.i.d. per rank (Gaussian, or Student-t with 3
degrees of freedom for `--data heavy`), so ||X||^2 grows like n and vNMSE
like MSE / n. `--data identical` gives every rank the same Gaussian vector:
appendix B's worst case, where partial sums grow linearly with the subtree
size and ||X||^2 like n^2. Fits the log-log slope per row and writes the table, JSON and a
PNG plot as the part `--data` of experiments/results/topology/ (`--out DIR` for a scratch run).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402

import dynamiq  # noqa: E402

DEFAULT_ROWS = [
    "dynamiq:5:correlated", "dynamiq:5:independent", "dynamiq:3:correlated",
    "bitsplit:4", "bitsplit:8", "lossless", "none",
]
# Exact rows: their vNMSE is float32 summation rounding against the float64
# sum (~1e-15), not codec error; "lossless" must equal "none" exactly.
EXACT_MODES = ("lossless", "none")


def row_config(row: str, topology: str):
    parts = row.split(":")
    mode = parts[0]
    kw = {"mode": mode, "topology": topology}
    if mode == "dynamiq":
        kw["bits"] = float(parts[1])
        if len(parts) > 2:
            kw["rounding"] = parts[2]
    elif mode == "bitsplit":
        kw["bits"] = int(parts[1])
    return dynamiq.Config(**kw)


def make_inputs(n: int, numel: int, data: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    if data == "gaussian":
        return [torch.randn(numel, generator=g) * 1e-3 for _ in range(n)]
    if data == "identical":
        z = torch.randn(numel, generator=g) * 1e-3
        return [z.clone() for _ in range(n)]
    # Student-t(3): heavy tails like gradients
    out = []
    for _ in range(n):
        z = torch.randn(numel, generator=g)
        chi2 = sum(torch.randn(numel, generator=g) ** 2 for _ in range(3))
        out.append(z / torch.sqrt(chi2 / 3) * 1e-3)
    return out


def vnmse(result: torch.Tensor, inputs) -> float:
    exact = torch.stack([x.double() for x in inputs]).sum(0)
    return float(((result.double() - exact) ** 2).sum() / (exact ** 2).sum())


def fit_slope(recs) -> str:
    """Least-squares slope of log vNMSE against log n ("-" with fewer than 2 points)."""
    pts = [(math.log(r["n"]), math.log(r["vnmse"])) for r in recs if r.get("vnmse", 0) > 0]
    if len(pts) < 2:
        return "-"
    mx = sum(a for a, _ in pts) / len(pts)
    my = sum(b for _, b in pts) / len(pts)
    return f"{sum((a - mx) * (b - my) for a, b in pts) / sum((a - mx) ** 2 for a, _ in pts):.2f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])
    p.add_argument("--topologies", nargs="+", default=dynamiq.available_topologies(compositions=False),
                   help="default: every schedule of this build (dynamiq.available_topologies)")
    p.add_argument("--rows", nargs="+", default=DEFAULT_ROWS)
    p.add_argument("--numel", type=int, default=1 << 18)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--data", choices=["gaussian", "heavy", "identical"], default="gaussian")
    p.add_argument("--out", default=None, help="study folder to write instead of experiments/results/topology")
    args = p.parse_args(argv)
    run = results_io.Run("topology", "vNMSE against world size: ring, butterfly, two-step", script=__file__,
                         argv=argv, out=args.out)

    available = dynamiq.available_modes()
    results = []  # dicts: row, topology, n, vnmse (mean over trials) or error
    total = len(args.rows) * len(args.topologies) * len(args.worlds)
    done = 0
    t_start = time.time()
    for row in args.rows:
        mode = row.split(":")[0]
        for topo in args.topologies:
            for n in args.worlds:
                done += 1
                rec = {"row": row, "topology": topo, "n": n}
                if mode not in available:
                    rec["error"] = f"mode {mode} not built"
                else:
                    vals = []
                    for trial in range(args.trials):
                        xs = make_inputs(n, args.numel, args.data, seed=1000 * n + trial)
                        cfg = row_config(row, topo).replace(seed=trial)
                        out = dynamiq.simulate(xs, cfg, op="sum")
                        vals.append(vnmse(out[0], xs))
                        if mode == "lossless":  # must be bit-identical to the uncompressed schedule
                            ref = dynamiq.simulate(xs, row_config("none", topo), op="sum")
                            same = bool(torch.equal(out[0], ref[0]))
                            rec["equals_none"] = rec.get("equals_none", True) and same
                    rec["vnmse"] = sum(vals) / len(vals)
                results.append(rec)
                print(f"[{done}/{total} {time.time() - t_start:6.0f}s] {row:24s} {topo:9s} n={n:3d} "
                      f"{rec.get('vnmse', rec.get('error'))}"
                      + (f" equals none: {rec['equals_none']}" if "equals_none" in rec else ""), flush=True)

    # table: rows x topology, columns n; and log-log slope fits
    headers = ["row", "topology"] + [f"n={n}" for n in args.worlds] + ["slope", "slope n>=8"]
    table = []
    for row in args.rows:
        for topo in args.topologies:
            recs = [r for r in results if r["row"] == row and r["topology"] == topo]
            cells = [f"{r['vnmse']:.2e}" if "vnmse" in r else r["error"] for r in recs]
            table.append([row, topo] + cells + [fit_slope(recs), fit_slope([r for r in recs if r["n"] >= 8])])
    checked = [r["equals_none"] for r in results if "equals_none" in r]
    lossless_exact = ("yes" if all(checked) else "NO") if checked else "not run"
    md = (f"vNMSE of the sum, {args.data} data, {args.numel} elements per rank, mean of {args.trials} trials; "
          f"slope = least-squares slope of log vNMSE against log n (all n, and n >= 8 only). "
          f"Rows {', '.join(EXACT_MODES)}: float32 summation rounding, not codec error; "
          f"lossless output bit-identical to mode none in every cell: {lossless_exact}.\n\n"
          + benchlib.markdown_table(headers, table))
    print(md)
    plot = None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        lossy = [r for r in args.rows if r.split(":")[0] not in EXACT_MODES]
        exact = [r for r in args.rows if r.split(":")[0] in EXACT_MODES]
        fig, axes = plt.subplots(1, 2 if exact else 1, figsize=(12 if exact else 8, 7.5),
                                 gridspec_kw={"width_ratios": [3, 1.4]} if exact else None, squeeze=False)
        # one line style and marker per topology, in the registry's order
        styles = dict(zip(args.topologies, ["-", "--", ":", "-."] * len(args.topologies)))
        markers = dict(zip(args.topologies, ["o", "s", "^", "D", "v", "x"] * len(args.topologies)))
        for ax, rows_here, title in ((axes[0][0], lossy, f"lossy codecs ({args.data} data)"),
                                     (axes[0][-1] if exact else None, exact, "exact modes: float32 rounding floor")):
            if ax is None or not rows_here:
                continue
            for i, row in enumerate(rows_here):
                for topo in args.topologies:
                    recs = [r for r in results if r["row"] == row and r["topology"] == topo and r.get("vnmse", 0) > 0]
                    if recs:
                        ax.plot([r["n"] for r in recs], [r["vnmse"] for r in recs], styles.get(topo, "-"),
                                color=f"C{args.rows.index(row)}", marker=markers.get(topo, "o"), ms=3,
                                label=f"{row} {topo}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(args.worlds, [str(n) for n in args.worlds])
            ax.minorticks_off()
            ax.set_yscale("log")
            ax.set_xlabel("world size n (log scale)")
            ax.set_ylabel("vNMSE of the all-reduced sum (log scale)")
            ax.set_title(title, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, ncol=3 if len(rows_here) > 2 else 1, loc="upper center",
                      bbox_to_anchor=(0.5, -0.13))
        fig.suptitle(f"vNMSE vs world size, {args.numel} elements per rank, mean of {args.trials} trials "
                     "(ring solid, butterfly dashed, twostep dotted)", fontsize=10)
        fig.tight_layout()
        plot = f"{args.data}.png"
        fig.savefig(run.path(plot), dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot")
    print("[topology]", run.write(args.data, md, data={"args": vars(args), "results": results}, plot=plot))


if __name__ == "__main__":
    main()
