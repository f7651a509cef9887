"""Bar chart of a bench_allreduce.py part: median time per method, one group of bars per world,
error bars from min to max. Saved as PNG next to the part's JSON.

    python experiments/bench/plot_allreduce_bars.py experiments/results/auto_netbed/auto_10gbit.json
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path: str) -> str:
    d = json.load(open(path))
    rows = [r for r in d["rows"] if not r.get("error")]
    worlds = sorted({r["world"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(methods) * len(worlds) / 2, 3.6))
    w = 0.8 / len(methods)
    for i, m in enumerate(methods):
        xs, ys, lo, hi = [], [], [], []
        for j, n in enumerate(worlds):
            r = next((r for r in rows if r["world"] == n and r["method"] == m), None)
            if r is None:
                continue
            t = [x * 1e3 for x in r["times"]]
            med = r["median"] * 1e3
            xs.append(j + (i - (len(methods) - 1) / 2) * w)
            ys.append(med)
            lo.append(med - min(t))
            hi.append(max(t) - med)
        ax.bar(xs, ys, w, yerr=[lo, hi], capsize=2, label=m)
    ax.set_xticks(range(len(worlds)), [f"{n} ranks" for n in worlds])
    ax.set_ylabel("ms per all-reduce (median, min-max)")
    ax.set_title(path.rsplit("/", 1)[-1].removesuffix(".json"))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = path.removesuffix(".json") + ".png"
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(plot(p))
