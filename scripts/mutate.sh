#!/usr/bin/env bash
# A scripted mutation campaign: each mutant of scripts/mutate/mutants.txt (one small semantic
# change to the codecs, allocator, schedule or header) is applied alone to a copy of the tree
# (build/mutate/src, kept between campaigns: an incremental build), the C++ suite is built and run, and the mutant counts as killed when a
# test fails, survived when the suite passes, stillborn when it does not compile (not counted).
#   bash scripts/mutate.sh                 # every mutant; report in build/mutate/report.json
#   bash scripts/mutate.sh --record        # and write experiments/results/mutation/
#   MUTANTS=3,7 bash scripts/mutate.sh     # some mutants only (1-based, in file order)
#   bash scripts/mutate.sh --report [--record]   # the report of the last (or running) campaign so far
# The report (and the record, with each mutant's verdict) is written by scripts/mutate/report.py.
# The suite runs as in scripts/test.sh (all tests but the exhaustive float sweep and the GPU
# ones), stopping at its first failure; builds and suite at the campaign's own priority (run it
# as `nice -n 10 bash scripts/mutate.sh`: a nicer build starves behind other jobs on a shared
# machine). A run longer than MUTATE_TIMEOUT s (default 900) counts as killed (a hang).
set -euo pipefail
cd "$(dirname "$0")/.."
RECORD=0
REPORT_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --record) RECORD=1 ;;
    --report) REPORT_ONLY=1 ;;
    *) echo "mutate.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
W=build/mutate
if [ "$REPORT_ONLY" -eq 1 ]; then  # the report of the last campaign (so far, if it is still running)
  REPORT_ARGS=()
  [ "$RECORD" -eq 1 ] && REPORT_ARGS=(--record)
  exec python3 scripts/mutate/report.py "$W" "${REPORT_ARGS[@]}"
fi
JOBS=${JOBS:-2}
TIMEOUT=${MUTATE_TIMEOUT:-900}
log() { printf '[mutate] %s\n' "$*"; }

# The working tree as it is (committed or not), without build outputs, synced into $W/src: only
# files whose bytes differ are copied (the others keep their time stamps), so that ninja rebuilds
# only what changed since the last campaign, and each mutant costs the recompilation of its file
# (and of the files that include it, for a header) and a link. ccache serves restored files.
python3 - "$W/src" <<'PYEOF'
import os, shutil, sys
dst = sys.argv[1]
skip = {"./build", "./.venv", "./.git"}
seen = set()
for root, dirs, files in os.walk("."):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip and d != "__pycache__"]
    for f in files:
        s = os.path.join(root, f)
        d = os.path.join(dst, s)
        seen.add(os.path.normpath(d))
        if os.path.islink(s) or not os.path.isfile(s):
            continue
        if os.path.isfile(d):
            with open(s, "rb") as a, open(d, "rb") as b:
                if a.read() == b.read():
                    continue
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copyfile(s, d)
for root, dirs, files in os.walk(dst):
    for f in files:
        d = os.path.normpath(os.path.join(root, f))
        if d not in seen:
            os.remove(d)
PYEOF
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true
fi
cmake -S $W/src -B $W/build -G Ninja -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_BUILD_TESTS=ON -DDYNAMIQ_CUDA=OFF \
  >$W/configure.log 2>&1 || { cat $W/configure.log; exit 1; }

FILTER='-FloatBitsSweep.*:Cuda*'
run_suite() {  # $1: log file; returns the suite's exit status (124: timeout)
  GTEST_FAIL_FAST=1 timeout "$TIMEOUT" $W/build/dynamiq_tests --gtest_brief=1 --gtest_filter="$FILTER" >"$1" 2>&1
}

log "baseline: build and run the unmutated suite"
t0=$SECONDS
ninja -C $W/build -j "$JOBS" dynamiq_tests >$W/build.log 2>&1 || { tail -40 $W/build.log; exit 1; }
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
  if ! ninja -C $W/build -j "$JOBS" dynamiq_tests >$W/mutant-$id-build.log 2>&1; then
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
  cp "$file" "$W/src/$file"  # pristine again (a newer time stamp: the next build recompiles it, from ccache)
  log "#$id $result ${killer:+by $killer }($((SECONDS - t0)) s): $what"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$result" "$killer" "$((SECONDS - t0))" "$file" "$what" >>$W/results.tsv
done <$W/mutants.tsv
ninja -C $W/build -j "$JOBS" dynamiq_tests >/dev/null 2>&1 || true  # back to the pristine build

REPORT_ARGS=()
[ "$RECORD" -eq 1 ] && REPORT_ARGS=(--record)
python3 scripts/mutate/report.py "$W" "${REPORT_ARGS[@]}"
