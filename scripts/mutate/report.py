"""The report of a mutation campaign (scripts/mutate.sh): build/mutate/report.json from the per-mutant
results (build/mutate/results.tsv), and with --record experiments/results/mutation/ (README.md and
mutation.json) with each mutant's verdict. A campaign stopped before its last mutant is reported as
partial: the score counts the mutants that ran, and the others are listed as not run.

    python3 scripts/mutate/report.py build/mutate [--record] [--command "..."]
"""

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Mutants shown equivalent (no test can kill them): id -> the argument. Filled in by hand after a
# campaign, in docs/reliability.md's words; the score excludes them from the denominator only
# when listed here.
EQUIVALENT: dict = {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--command", default="nice -n 10 bash scripts/mutate.sh --record")
    a = ap.parse_args()
    w = a.workdir
    planned = {}
    for line in open(os.path.join(w, "mutants.tsv")):
        i, f, _expr, what = line.rstrip("\n").split("\t", 3)
        planned[int(i)] = (f, what)
    rows = []
    for line in open(os.path.join(w, "results.tsv")):
        i, result, killer, secs, f, what = line.rstrip("\n").split("\t")
        rows.append(dict(id=int(i), result=result, killed_by=killer, seconds=int(secs), file=f, mutant=what))
    done = {r["id"] for r in rows}
    for i, (f, what) in sorted(planned.items()):
        if i not in done:
            rows.append(dict(id=i, result="not run", killed_by="", seconds=0, file=f, mutant=what))
    rows.sort(key=lambda r: r["id"])
    for r in rows:
        if r["result"] == "survived" and str(r["id"]) in EQUIVALENT:
            r["result"] = "equivalent"
            r["killed_by"] = EQUIVALENT[str(r["id"])]
    counted = [r for r in rows if r["result"] in ("killed", "survived")]
    killed = sum(r["result"] == "killed" for r in counted)
    score = 100.0 * killed / len(counted) if counted else 0.0
    not_run = sum(r["result"] == "not run" for r in rows)
    report = dict(mutants=len(rows), counted=len(counted), killed=killed, score_percent=round(score, 1),
                  not_run=not_run, rows=rows)
    json.dump(report, open(os.path.join(w, "report.json"), "w"), indent=1)
    print(f"score: {killed}/{len(counted)} killed = {score:.1f} % "
          f"({sum(r['result'] == 'stillborn' for r in rows)} stillborn, "
          f"{sum(r['result'] == 'not-applied' for r in rows)} not applied, "
          f"{sum(r['result'] == 'equivalent' for r in rows)} equivalent, {not_run} not run)")
    for r in rows:
        if r["result"] != "killed":
            print(f"  #{r['id']} {r['result']}: {r['mutant']} ({r['file']})")
    if not a.record:
        return
    sys.path.insert(0, REPO)
    from experiments import results_io
    run = results_io.Run("mutation", "Mutation testing of the C++ suite", command=a.command)
    partial = f" **Partial: {not_run} of {len(rows)} mutants not run** (the campaign was stopped)." if not_run else ""
    md = [f"**Score: {killed} of {len(counted)} mutants killed ({score:.1f} %).**{partial} Each mutant "
          "(scripts/mutate/mutants.txt) alone on a copy of the tree, the C++ suite as in scripts/test.sh (gcc, -O3, no "
          "sanitizers, all tests but the float sweep and the GPU ones), stopping at the first failing test; "
          "equivalent: a survivor shown to change no observable result (docs/reliability.md). Seconds: the "
          "incremental rebuild and the suite, on a machine shared with other jobs.",
          "", "| # | mutant | file | result | first failing test | s |", "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['id']} | {r['mutant']} | `{r['file']}` | {r['result']} | {r['killed_by']} | {r['seconds']} |")
    print(run.write("mutation", "\n".join(md), data=report))


if __name__ == "__main__":
    main()
