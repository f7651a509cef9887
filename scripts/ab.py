"""The rows and ratios of scripts/ab.sh: what one run of a bench produced, and B against A.

    python3 scripts/ab.py rows RUN_DIR                      # the rows one run wrote (key, time)
    python3 scripts/ab.py report RUNS_DIR [--allow-loaded]  # the per-row ratios of a finished A/B

A run's directory holds the bench's JSON output (anything *.json but load.json: dynamiq.bench's
--json, the results_io part JSON of experiments/bench/*.py) and load.json, the load record that
python/dynamiq/_load.py wrote around it (with the run's exit code). RUNS_DIR holds r<round>_A and
r<round>_B. A row is any dict in a "rows" list with a time ("time" for dynamiq.bench, "median" for
experiments/bench); its key is its identifying fields (collective, method or mode and its
parameter, topology, world, size or bytes, dtype) in that order. A failed row (an "error") has no
time.

The report: per row, A's and B's median time over the rounds, and the ratio B/A of the times
(below 1: B is faster) as the median of the rounds' ratios with their spread (min..max; each
round's B run against the same round's A run, the two taken back to back); then the load of every
run. Exit 0; 1 when a run failed or a row is missing or failed in a run; 3 when a run was loaded
(python/dynamiq/_load.py's verdict) and --allow-loaded is not given.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
from typing import Dict, List, Optional, Tuple

KEY_FIELDS = ("collective", "method", "mode", "bits", "error_bound", "topology", "world", "size", "bytes", "dtype")


def row_key(row: dict) -> str:
    parts = []
    for k in KEY_FIELDS:
        v = row.get(k)
        if v is None:
            continue
        if k in ("bits", "error_bound") and isinstance(v, float):
            v = f"{v:g}"
        parts.append(f"w{v}" if k == "world" else str(v))
    return " ".join(parts)


def _rows_in(obj) -> List[dict]:
    """Every dict of every "rows" list in obj (at any depth)."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "rows" and isinstance(v, list):
                out += [r for r in v if isinstance(r, dict)]
            else:
                out += _rows_in(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _rows_in(v)
    return out


def run_rows(run_dir: str) -> Dict[str, Optional[float]]:
    """{row key: time in seconds, None for a failed row} of one run."""
    rows: Dict[str, Optional[float]] = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "**", "*.json"), recursive=True)):
        if os.path.basename(path) == "load.json" or path.endswith(".load.json"):
            continue
        try:
            data = json.load(open(path))
        except (OSError, ValueError):
            continue
        for r in _rows_in(data):
            t = r.get("time", r.get("median"))
            if not isinstance(t, (int, float)) and r.get("error") is None:
                continue  # not a timed row
            rows[row_key(r)] = float(t) if isinstance(t, (int, float)) and not r.get("error") else None
    return rows


def run_load(run_dir: str) -> Optional[dict]:
    try:
        return json.load(open(os.path.join(run_dir, "load.json")))
    except (OSError, ValueError):
        return None


def _runs(runs_dir: str) -> List[Tuple[int, str, str]]:
    """[(round, side, dir)] in the order they ran: the directory names give the round, the file ORDER
    (one directory name a line, written by ab.sh as each run starts) the order within a round."""
    out = []
    for d in os.listdir(runs_dir):
        m = re.fullmatch(r"r(\d+)_([AB])", d)
        if m:
            out.append((int(m.group(1)), m.group(2), os.path.join(runs_dir, d)))
    order = {}
    try:
        for i, line in enumerate(open(os.path.join(runs_dir, "ORDER"))):
            order[line.strip()] = i
    except OSError:
        pass
    return sorted(out, key=lambda x: (x[0], order.get(os.path.basename(x[2]), 0), x[1]))


def report(runs_dir: str, allow_loaded: bool = False, out=sys.stdout) -> int:
    runs = _runs(runs_dir)
    names = {}
    try:
        names = json.load(open(os.path.join(runs_dir, "sides.json")))
    except (OSError, ValueError):
        pass
    rounds = sorted({r for r, _, _ in runs})
    times: Dict[Tuple[int, str], Dict[str, Optional[float]]] = {(r, s): run_rows(d) for r, s, d in runs}
    loads = {(r, s): run_load(d) for r, s, d in runs}
    keys = list(dict.fromkeys(k for r, s, _ in runs for k in times[(r, s)]))
    rc = 0
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"# A = {names.get('A', 'A')}, B = {names.get('B', 'B')}; {len(rounds)} round(s); time = the row's own time "
      "(median over its iterations); ratio = B/A of the times, per round (B run beside A run), "
      "median [min..max] over rounds; < 1: B faster")
    w = max([len(k) for k in keys] + [10])
    p(f"{'row':<{w}} {'A (s)':>11} {'B (s)':>11} {'B/A':>7}  spread")
    for k in keys:
        ratios, ta, tb = [], [], []
        missing = False
        for r in rounds:
            a, b = times.get((r, "A"), {}).get(k), times.get((r, "B"), {}).get(k)
            if a is None or b is None:
                missing = True
                continue
            ta.append(a)
            tb.append(b)
            ratios.append(b / a)
        if not ratios:
            p(f"{k:<{w}} {'-':>11} {'-':>11} {'-':>7}  failed or missing in every round")
            rc = 1
            continue
        note = "  (failed or missing in some round)" if missing else ""
        rc = 1 if missing else rc
        p(f"{k:<{w}} {statistics.median(ta):11.6f} {statistics.median(tb):11.6f} {statistics.median(ratios):7.3f}  "
          f"{min(ratios):.3f}..{max(ratios):.3f}{note}")
    p("# load of each run (python/dynamiq/_load.py: 1-min load average before -> after, other processes' "
      "share of the CPUs before/during/after)")
    loaded = 0
    for r, s, d in runs:
        rec = loads[(r, s)]
        if rec is None:
            p(f"round {r} {s}: no load record ({d})")
            rc = 1
            continue
        code = rec.get("exit_code", 0)
        p(f"round {r} {s}: {rec.get('seconds', 0):.0f} s, exit {code}; {_summary(rec)}")
        loaded += bool(rec.get("loaded"))
        if code != 0:
            rc = 1
    if loaded:
        p(f"# {loaded} of {len(runs)} runs LOADED: "
          + ("not to be quoted (--allow-loaded given)" if allow_loaded else "no claim from this A/B (exit 3)"))
        if not allow_loaded and rc == 0:
            rc = 3
    return rc


def _summary(rec: dict) -> str:
    o = "/".join("?" if rec.get("others_" + x) is None else f"{100 * rec['others_' + x]:.0f}"
                 for x in ("before", "during", "after"))
    la = rec.get("load1_after")
    return (f"load {rec.get('load1_before', 0):.2f} -> {'?' if la is None else format(la, '.2f')}, others {o} %, "
            + ("LOADED" if rec.get("loaded") else "quiet"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rows")
    r.add_argument("run_dir")
    rep = sub.add_parser("report")
    rep.add_argument("runs_dir")
    rep.add_argument("--allow-loaded", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "rows":
        rows = run_rows(a.run_dir)
        for k, t in rows.items():
            print(f"{k}\t{'failed' if t is None else t}")
        return 0 if rows else 1
    return report(a.runs_dir, a.allow_loaded)


if __name__ == "__main__":
    sys.exit(main())
