#!/usr/bin/env bash
# A/B of a benchmark: another commit (A) against this checkout (B), interleaved, with the load of
# every run. Use it for every "faster" or "slower" claim (docs/bench.md, "Comparing two commits").
#
#   bash scripts/ab.sh [--rounds N] [--allow-loaded] [--dry-run] <commit> -- <bench command...>
#   bash scripts/ab.sh f041b3d -- python experiments/bench/bench_allreduce.py --netbed 1gbit \
#       --worlds 2 4 --sizes-mb 64 --repeats 5 --methods gloo dynamiq:ring:5 --out {out}
#   bash scripts/ab.sh HEAD~1 -- python -m dynamiq.bench --local 2 --sizes 1M --json {out}/bench.json
#
# A: <commit> checked out (detached) in a git worktree at $AB_DIR/<hash> (default build/ab/; kept and
#    reused by later runs), with its own .venv: this checkout's hard-linked (cp -al; pip replaces the
#    files it changes instead of writing through the links, and the scripts in .venv/bin get their
#    own copies pointing at A's interpreter), then that commit's scripts/setup.sh, which installs
#    A's extension editable from A's tree through the ccache this checkout's builds fill
#    (scripts/ccache_env.sh: paths relative to the tree, so the same source gives the same hit).
# B: this checkout as it is (uncommitted changes included), after scripts/setup.sh here.
#
# Each round runs the command once for each side, A first in odd rounds and B first in even ones
# (default 3 rounds), each in its own tree's root with its tree's .venv/bin first on PATH (so
# `python` is that tree's interpreter; use `python -m torch.distributed.run`, not `torchrun`, whose
# script names one interpreter), under python/dynamiq/_load.py (the load record, load.json). In the
# command, {out} is the run's own directory (build/ab/runs-<time>/r<round>_<side>); without {out},
# `--json {out}/bench.json` is added for `-m dynamiq.bench` and `--out {out}` for experiments/bench/
# scripts. scripts/ab.py then prints per row A's and B's time, the ratio B/A (median over rounds,
# spread min..max) and every run's load.
#
# Exit: 0; 1 a run failed or a row is missing; 2 bad usage or the build of A failed; 3 a run was
# loaded (over _load.py's thresholds) and --allow-loaded was not given: such an A/B makes no claim.
#   --dry-run   no worktree, no build: A is this checkout too (tests the rounds, the parsing and the
#               ratios; tests/python/test_ab.py runs it on a fake bench).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=3 ALLOW="" DRY=0
usage() { sed -n 2,32p "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) [ $# -ge 2 ] || usage; ROUNDS=$2; shift 2 ;;
    --rounds=*) ROUNDS=${1#--rounds=}; shift ;;
    --allow-loaded) ALLOW=--allow-loaded; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage ;;
    --) usage ;;
    -*) echo "ab.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -ge 3 ] && [ "$2" = "--" ] || usage
COMMIT=$1; shift 2
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: --rounds $ROUNDS: expected a positive integer" >&2; exit 2; }
SHA=$(git rev-parse --verify --quiet "$COMMIT^{commit}") || { echo "ab.sh: $COMMIT is not a commit" >&2; exit 2; }
SHORT=$(git rev-parse --short "$SHA")
PY=python3; [ -x .venv/bin/python ] && PY=$ROOT/.venv/bin/python
AB_DIR=${AB_DIR:-$ROOT/build/ab}
mkdir -p "$AB_DIR"; AB_DIR=$(cd "$AB_DIR" && pwd)

# ---- the command, with {out} ------------------------------------------------------------------
CMD=("$@")
if ! printf '%s\n' "${CMD[@]}" | grep -q '{out}'; then
  if printf '%s\n' "${CMD[@]}" | grep -qx 'dynamiq.bench'; then CMD+=(--json '{out}/bench.json')
  elif printf '%s\n' "${CMD[@]}" | grep -q '^experiments/bench/.*\.py$'; then CMD+=(--out '{out}')
  else echo "ab.sh: the command must write its JSON under {out} (the run's directory)" >&2; exit 2; fi
fi

# ---- A's tree ------------------------------------------------------------------------------------
DIRTY=""; [ -z "$(git status --porcelain --untracked-files=no)" ] || DIRTY=" + uncommitted changes"
B_DESC="this checkout ($(git rev-parse --short HEAD)$DIRTY)"
if [ "$DRY" = 1 ]; then
  A_TREE=$ROOT; A_DESC="$SHORT (dry run: this checkout stands in for it)"
else
  A_TREE=$AB_DIR/$SHORT; A_DESC="$SHORT ($A_TREE)"
  if [ ! -e "$A_TREE/.git" ]; then
    git worktree add --detach "$A_TREE" "$SHA" >/dev/null
  fi
  [ "$(git -C "$A_TREE" rev-parse HEAD)" = "$SHA" ] || { echo "ab.sh: $A_TREE is not at $SHORT" >&2; exit 2; }
  if [ ! -x "$A_TREE/.venv/bin/python" ]; then
    [ -x .venv/bin/python ] || bash scripts/setup.sh
    cp -al .venv "$A_TREE/.venv"
    # the console scripts name B's interpreter: new files (not writes through the links) naming A's
    for f in "$A_TREE"/.venv/bin/*; do
      [ -f "$f" ] && [ ! -L "$f" ] || continue
      head -c 2 "$f" | grep -q '^#!' || continue
      sed "1s|^#!.*/bin/python[0-9.]*\$|#!$A_TREE/.venv/bin/python|" "$f" >"$f.ab" && chmod --reference="$f" "$f.ab" \
        && mv -f "$f.ab" "$f"
    done
  fi
  echo "[ab] setting up A = $SHORT in $A_TREE (scripts/setup.sh there; log $A_TREE/build/ab-setup.log)"
  mkdir -p "$A_TREE/build"
  (cd "$A_TREE" && bash scripts/setup.sh) >"$A_TREE/build/ab-setup.log" 2>&1 \
    || { tail -30 "$A_TREE/build/ab-setup.log"; echo "ab.sh: the set-up of $SHORT failed" >&2; exit 2; }
  echo "[ab] setting up B = this checkout"
  bash scripts/setup.sh >build/ab-setup-B.log 2>&1 || { tail -30 build/ab-setup-B.log; exit 2; }
fi

# ---- the rounds ----------------------------------------------------------------------------------
RUNS=${AB_RUNS:-$AB_DIR/runs-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$RUNS"; : >"$RUNS/ORDER"
"$PY" -c 'import json, sys; json.dump(dict(A=sys.argv[2], B=sys.argv[3], command=sys.argv[4:]), open(sys.argv[1], "w"))' \
  "$RUNS/sides.json" "$A_DESC" "$B_DESC" "${CMD[@]}"
echo "[ab] A = $A_DESC; B = $B_DESC; $ROUNDS round(s); runs in $RUNS"
echo "[ab] command: ${CMD[*]}"
run_side() {  # $1 round, $2 side
  local dir="$RUNS/r$1_$2" tree=$ROOT args=() rc=0
  [ "$2" = A ] && tree=$A_TREE
  mkdir -p "$dir"; echo "r$1_$2" >>"$RUNS/ORDER"
  for a in "${CMD[@]}"; do args+=("${a//\{out\}/$dir}"); done
  echo "[ab] round $1, $2: started $(date -u +%H:%M:%S)"
  (cd "$tree" && PATH="$tree/.venv/bin:$PATH" VIRTUAL_ENV="$tree/.venv" \
     "$PY" "$ROOT/python/dynamiq/_load.py" --json "$dir/load.json" --label "round $1 $2" -- "${args[@]}") \
    >"$dir/output.txt" 2>&1 || rc=$?
  # (the last verdict line is the wrapper's; the bench may print its own before it)
  echo "[ab] round $1, $2: exit $rc; $(sed -n 's/^# load verdict: //p' "$dir/output.txt" | tail -1 | cut -c1-150)"
  [ "$rc" -eq 0 ] || tail -5 "$dir/output.txt" | sed 's/^/[ab]   /'
}
for ((i = 1; i <= ROUNDS; i++)); do
  if [ $((i % 2)) = 1 ]; then run_side "$i" A; run_side "$i" B; else run_side "$i" B; run_side "$i" A; fi
done
rc=0
"$PY" "$ROOT/scripts/ab.py" report "$RUNS" $ALLOW >"$RUNS/report.txt" || rc=$?
cat "$RUNS/report.txt"
exit "$rc"
