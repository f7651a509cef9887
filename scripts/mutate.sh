#!/usr/bin/env bash
# A scripted mutation campaign: each mutant of scripts/mutate/mutants.txt (one small semantic
# change to the codecs, allocator, schedule or header) is applied alone to a copy of the tree
# (build/mutate/src), the C++ suite is built and run, and the mutant counts as killed when a
# test fails, survived when the suite passes, stillborn when it does not compile (not counted).
#   bash scripts/mutate.sh                 # every mutant; report in build/mutate/report.json
#   bash scripts/mutate.sh --record        # and write experiments/results/mutation/
#   MUTANTS=3,7 bash scripts/mutate.sh     # some mutants only (1-based, in file order)
# The suite runs as in scripts/test.sh (all tests but the exhaustive float sweep and the GPU
# ones), stopping at its first failure, at normal priority (some tests bound their own time);
# builds at nice 19. A run longer than MUTATE_TIMEOUT s (default 900)
# counts as killed (a hang).
set -euo pipefail
cd "$(dirname "$0")/.."
RECORD=0
[ "${1:-}" = "--record" ] && RECORD=1
JOBS=${JOBS:-2}
TIMEOUT=${MUTATE_TIMEOUT:-900}
W=build/mutate
log() { printf '[mutate] %s\n' "$*"; }

# the working tree as it is (committed or not), without build outputs (a fresh copy: ninja then
# rebuilds everything once, mostly from ccache)
rm -rf $W/src
mkdir -p $W/src
tar -c --exclude=./build --exclude=./.venv --exclude=./.git --exclude=__pycache__ . | tar -x -C $W/src
command -v ccache >/dev/null 2>&1 && export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
cmake -S $W/src -B $W/build -G Ninja -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_BUILD_TESTS=ON -DDYNAMIQ_CUDA=OFF \
  >$W/configure.log 2>&1 || { cat $W/configure.log; exit 1; }

FILTER='-FloatBitsSweep.*:Cuda*'
run_suite() {  # $1: log file; returns the suite's exit status (124: timeout)
  GTEST_FAIL_FAST=1 timeout "$TIMEOUT" $W/build/dynamiq_tests --gtest_brief=1 --gtest_filter="$FILTER" >"$1" 2>&1
}

log "baseline: build and run the unmutated suite"
t0=$SECONDS
nice -n 19 ninja -C $W/build -j "$JOBS" dynamiq_tests >$W/build.log 2>&1 || { tail -40 $W/build.log; exit 1; }
run_suite $W/baseline.log || { tail -30 $W/baseline.log; log "the unmutated suite fails: fix that first"; exit 1; }
log "baseline passes ($((SECONDS - t0)) s)"

python3 - "$W" "${MUTANTS:-}" <<'EOF' >$W/mutants.tsv
import sys
w, pick = sys.argv[1], sys.argv[2]
rows = []
for line in open("scripts/mutate/mutants.txt"):
    line = line.rstrip("\n")
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    f, expr, what = (x.strip() for x in line.split(" | ", 2))
    rows.append((f, expr, what))
want = {int(x) for x in pick.split(",") if x} if pick else None
for i, (f, expr, what) in enumerate(rows, 1):
    if want is None or i in want:
        print(f"{i}\t{f}\t{expr}\t{what}")
EOF

: >$W/results.tsv
while IFS=$'\t' read -r id file expr what; do
  cp "$file" "$W/src/$file"  # pristine
  sed -i -e "$expr" "$W/src/$file"
  if cmp -s "$file" "$W/src/$file"; then
    log "#$id NOT APPLIED (the expression matches nothing): $what"
    printf '%s\tnot-applied\t\t0\t%s\t%s\n' "$id" "$file" "$what" >>$W/results.tsv
    continue
  fi
  t0=$SECONDS
  if ! nice -n 19 ninja -C $W/build -j "$JOBS" dynamiq_tests >$W/mutant-$id-build.log 2>&1; then
    result=stillborn; killer="(does not compile)"
  elif run_suite $W/mutant-$id.log; then
    result=survived; killer=""
  else
    rc=$?
    result=killed
    killer=$(grep -m1 -oE '\[  FAILED  \] [A-Za-z0-9_/.]+' $W/mutant-$id.log | sed 's/\[  FAILED  \] //' || true)
    [ "$rc" -eq 124 ] && killer="(timeout: a hang)"
    [ -z "$killer" ] && killer="(exit $rc)"
  fi
  cp "$file" "$W/src/$file"
  log "#$id $result ${killer:+by $killer }($((SECONDS - t0)) s): $what"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$result" "$killer" "$((SECONDS - t0))" "$file" "$what" >>$W/results.tsv
done <$W/mutants.tsv
ninja -C $W/build -j "$JOBS" dynamiq_tests >/dev/null 2>&1 || true  # back to the pristine build

python3 - "$W" "$RECORD" <<'EOF'
import json, os, sys
w, record = sys.argv[1], sys.argv[2] == "1"
rows = []
for line in open(os.path.join(w, "results.tsv")):
    i, result, killer, secs, f, what = line.rstrip("\n").split("\t")
    rows.append(dict(id=int(i), result=result, killed_by=killer, seconds=int(secs), file=f, mutant=what))
counted = [r for r in rows if r["result"] in ("killed", "survived")]
killed = sum(r["result"] == "killed" for r in counted)
score = 100.0 * killed / len(counted) if counted else 0.0
report = dict(mutants=len(rows), counted=len(counted), killed=killed, score_percent=round(score, 1), rows=rows)
json.dump(report, open(os.path.join(w, "report.json"), "w"), indent=1)
print(f"score: {killed}/{len(counted)} killed = {score:.1f} % "
      f"({sum(r['result'] == 'stillborn' for r in rows)} stillborn, {sum(r['result'] == 'not-applied' for r in rows)} not applied)")
for r in rows:
    if r["result"] != "killed":
        print(f"  #{r['id']} {r['result']}: {r['mutant']} ({r['file']})")
if record:
    sys.path.insert(0, os.getcwd())
    from experiments import results_io
    run = results_io.Run("mutation", "Mutation testing of the C++ suite", command="bash scripts/mutate.sh --record")
    md = [f"**Score: {killed} of {len(counted)} mutants killed ({score:.1f} %).** Each mutant (scripts/mutate/mutants.txt) "
          "alone on a copy of the tree, the C++ suite as in scripts/test.sh (gcc, no sanitizers), stopping at the first "
          "failing test.", "", "| # | mutant | file | result | first failing test | s |", "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['id']} | {r['mutant']} | `{r['file']}` | {r['result']} | {r['killed_by']} | {r['seconds']} |")
    print(run.write("mutation", "\n".join(md), data=report))
EOF
