"""Soak: 2,000 DDP steps in every mode, 4 ranks on Gloo loopback, one mode after the other in the
same rank processes (tests/python/soaklib.py; the 200-step version is tests/python/test_soak.py).

Records per mode and rank: the host RSS after every step (the curve, as a PNG and a table), the
growth after the warm-up, whether the replicas' parameters are bit-identical, and the open file
descriptors and threads at the end of the warm-up, at the end, and after the model, optimizer and
hook state were dropped. Progress: one line per 5 % of a mode's steps (rank 0).

    nice -n 10 .venv/bin/python experiments/probes/soak.py            # 2,000 steps, results/soak/
    .venv/bin/python experiments/probes/soak.py --steps 300 --out experiments/out/soak
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "python"))  # soaklib.py and dist_utils.py (before the fork server starts)

from dist_utils import run_ranks  # noqa: E402
from experiments import results_io  # noqa: E402
import soaklib  # noqa: E402  (tests/python/soaklib.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--modes", default="", help="comma-separated (default: every mode)")
    ap.add_argument("--out", default=None, help="a scratch folder instead of experiments/results/soak")
    a = ap.parse_args()
    import dynamiq

    modes = [m for m in a.modes.split(",") if m] or dynamiq.available_modes()
    run = results_io.Run("soak", "Soak: 2,000 DDP steps per mode", argv=sys.argv[1:], script=__file__, out=a.out)
    t0 = time.time()
    res = run_ranks(soaklib.soak_rank, a.world, modes, a.steps, a.warmup, True, timeout=24 * 3600)
    wall = time.time() - t0

    mib = 1 / 2**20
    rows, data = [], {"steps": a.steps, "warmup": a.warmup, "world": a.world, "wall_seconds": wall, "modes": {}}
    ok = True
    for mode in modes:
        per = [r["modes"][mode] for r in res]
        identical = len({m["digest"] for m in per}) == 1 and all(m["finite"] for m in per)
        growth = [(max(m["rss"][a.warmup:]) - m["rss"][a.warmup - 1]) * mib for m in per]
        end_growth = [(m["rss"][-1] - m["rss"][a.warmup - 1]) * mib for m in per]
        fds = [(m["warm_counts"][0], m["end_counts"][0], m["fds"]) for m in per]
        thr = [(m["warm_counts"][1], m["end_counts"][1], m["threads"]) for m in per]
        leak = any(e > w for w, e, _ in fds) or any(e > w for w, e, _ in thr)
        ok &= identical and not leak
        rows.append(f"| {mode} | {'yes' if identical else '**no**'} | {per[0]['rss'][a.warmup - 1] * mib:.1f} | "
                    f"{max(growth):.2f} | {max(end_growth):+.2f} | "
                    f"{'/'.join(str(x) for x in fds[0])} | {'/'.join(str(x) for x in thr[0])} | "
                    f"{'**yes**' if leak else 'no'} | {sum(m['seconds'] for m in per) / len(per):.0f} |")
        data["modes"][mode] = {"identical": identical, "digest": per[0]["digest"], "rss_growth_max_mib": growth,
                               "rss_end_growth_mib": end_growth, "fds_warm_end_after": fds,
                               "threads_warm_end_after": thr, "seconds": [m["seconds"] for m in per],
                               "rss_mib": [[x * mib for x in m["rss"]] for m in per]}
    plot = run.path("soak.png")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(modes), figsize=(4 * len(modes), 3.2), sharey=False)
    for ax, mode in zip(axes if len(modes) > 1 else [axes], modes):
        for r, x in enumerate(res):
            ax.plot([v * mib for v in x["modes"][mode]["rss"]], lw=0.8, label=f"rank {r}")
        ax.axvline(a.warmup, color="grey", ls=":", lw=0.8)
        ax.set_title(f"mode {mode}")
        ax.set_xlabel("step")
    (axes[0] if len(modes) > 1 else axes).set_ylabel("host RSS (MiB)")
    (axes[0] if len(modes) > 1 else axes).legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(plot, dpi=110)

    # the curve as a table: RSS of rank 0 every 10 % of the steps
    marks = sorted({a.warmup - 1} | {min(a.steps - 1, (a.steps * k) // 10) for k in range(0, 11)})
    curve = ["| mode | " + " | ".join(f"step {s + 1}" for s in marks) + " |",
             "|---|" + "---|" * len(marks)]
    for mode in modes:
        rss = res[0]["modes"][mode]["rss"]
        curve.append(f"| {mode} | " + " | ".join(f"{rss[s] * mib:.2f}" for s in marks) + " |")
    md = [f"{a.world} ranks on Gloo loopback, {a.steps} steps per mode, one mode after the other in the same "
          f"processes (an MLP of 85k parameters, 2 buckets, SGD with momentum), warm-up {a.warmup} steps. "
          f"Wall time {wall / 60:.1f} min on a loaded machine (shared with other jobs).", "",
          "| mode | replicas bit-identical | RSS at warm-up end (MiB, rank 0) | max RSS growth after warm-up "
          "(MiB, worst rank) | RSS growth at the end (MiB, worst rank) | fds warm-up/end/after drop (rank 0) | "
          "threads warm-up/end/after drop (rank 0) | fd or thread growth | s per rank |",
          "|---|---|---|---|---|---|---|---|---|", *rows, "",
          "Host RSS of rank 0 (MiB):", "", *curve, "", "![RSS per step](soak.png)"]
    print(run.write("soak", "\n".join(md), data=data, plot="soak.png"))
    print("soak:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
