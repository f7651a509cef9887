#!/usr/bin/env bash
# dynamiq's GPU check: one command for a machine with one NVIDIA GPU (H100/H200 class), nvcc,
# CMake, ninja and PyTorch, but no GoogleTest and no package registry. Done in about 7 minutes
# from a bare machine. From the project root:
#   rm -rf build/gtest-src && cp -r /usr/src/googletest build/gtest-src   # carry GoogleTest's sources
#   GPU_CHECK_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_check.sh
# and through the device tool: run(command="GPU_CHECK_COMMIT=<hash> bash scripts/gpu_check.sh",
#   carry=["build/gtest-src"], timeout_s=480) -- DEADLINE_S (420 s) plus a margin; with a 1-2
#   minute machine start that leaves a 15-minute window room for one short rerun.
#
#   --dry-run   the same stages without a GPU: the CUDA sources compiled, the GPU tests (which
#               skip) and the CUDA emulation's tests run in their place. CI runs it after the other
#               stages with GPU_CHECK_BUILD_DIR=build/cpp (reuse that build),
#               GPU_CHECK_PYTHON=.venv/bin/python (reuse the installed extension) and
#               GPU_CHECK_EMU_FILTER / GPU_CHECK_CPU_FILTER (gtest filters: a few tests, since CI ran
#               them all already).
#
# Writes into $OUT (default /tmp/gpu_check_out) after every stage, so a run killed at any point
# still returns what finished: summary.txt (one line per stage and per GPU test), record.md (the
# run's record for experiments/results/gpu/: card, driver, torch, NCCL, date, commit, pass/fail per
# test, kernel table) and logs.tgz (every log). Every command has a timeout inside DEADLINE_S; a
# stage with too little time left is skipped and named, and a GPU run with a skipped stage ends
# "INCOMPLETE" (exit 3), never "all stages passed".
#
# Stages, most valuable first: machine facts -> GoogleTest -> one build (the torch-free C++ tests,
# the GPU benchmark and the Python extension, for the GPU's own architecture) -> every Cuda* test
# in its own process (a sticky CUDA error must not hide the others) -> GPU codec benchmark -> the
# one-GPU Python tests -> can two NCCL ranks share the GPU -> compute-sanitizer memcheck, racecheck,
# synccheck on the kernel tests -> the CPU tests on this machine's CPU (the reference; no GPU needed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
S=$SECONDS
DRY=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n 2,30p "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $a (try --help)" >&2; exit 2 ;;
  esac
done
DEADLINE_S=${DEADLINE_S:-420}
[ "$DRY" = 1 ] && DEADLINE_S=${DEADLINE_S_DRY:-1800}  # no GPU window to fit in
OUT=${OUT:-/tmp/gpu_check_out}
W=${GPU_CHECK_WORK:-/tmp/gpu_check_work}
JOBS=$(nproc)
rm -rf "$W"; mkdir -p "$W" "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0
SKIPPED=()
log() { echo "[$((SECONDS - S))s] $*" | tee -a "$SUMMARY"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL: $*"; }
left() { echo $((DEADLINE_S - (SECONDS - S))); }
have_time() { [ "$(left)" -ge "$1" ]; }
# a timeout for a command: at most $1 s, and never past the deadline (less $2 s kept for later stages)
budget() { local b=$(( $(left) - ${2:-10} )); [ "$b" -gt "$1" ] && b=$1; [ "$b" -lt 5 ] && b=5; echo "$b"; }
skip() { SKIPPED+=("$1"); log "$1: skipped ($2)"; }
pack() {
  [ -f "$W/record.md" ] && cp "$W/record.md" "$OUT/record.md"
  (cd "$W" && tar czf "$OUT/logs.tgz" ./*.log ./*.txt ./*.md ./*.json 2>/dev/null)
}
trap 'pack' EXIT

# ---- machine facts -----------------------------------------------------------------------------
PY=${GPU_CHECK_PYTHON:-python3}
[ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
{ timeout 20 nvidia-smi; nvcc --version; cmake --version; ninja --version; lscpu | head -25; } >"$W/env.log" 2>&1
# one interpreter start (a cold torch import is slow): versions, Python.h, the FSDP2 API dynamiq uses
timeout 90 "$PY" - >"$W/torch_facts.txt" 2>>"$W/env.log" <<'EOF'
import os, sys, sysconfig
inc = sysconfig.get_paths()["include"]
print("python", sys.version.split()[0], "headers", "yes" if os.path.exists(os.path.join(inc, "Python.h")) else "NO (" + inc + ")")
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda)
    print("nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")
    try:  # what dynamiq.fsdp subclasses
        from torch.distributed.fsdp._fully_shard import _fsdp_api as api
        print("fsdp2", "custom collectives" if hasattr(api, "ReduceScatter") else "no ReduceScatter API (dynamiq.fsdp unusable)")
    except Exception as e:  # noqa: BLE001 -- a fact, not a failure
        print("fsdp2", "not importable:", type(e).__name__, e)
except Exception as e:  # noqa: BLE001
    print("torch not importable:", type(e).__name__, e)
EOF
TORCH=$(awk '$1 == "torch" && $2 != "not" {print $2}' "$W/torch_facts.txt"); TORCH=${TORCH:-"not importable"}
NCCL=$(awk '$1 == "nccl" {print $2}' "$W/torch_facts.txt"); NCCL=${NCCL:--}
HAVE_GPU=0; ARCH=90; CARD="none"; DRIVER="-"
if [ "$DRY" = 0 ] && q=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
     --format=csv,noheader 2>/dev/null | head -1) && [ -n "$q" ]; then
  HAVE_GPU=1
  IFS=',' read -r CARD DRIVER MEM CAP <<<"$q"
  CARD=$(echo "$CARD" | xargs); DRIVER=$(echo "$DRIVER" | xargs); ARCH=$(echo "$CAP" | tr -d ' .')
  log "gpu: $CARD, driver $DRIVER,$MEM, sm_$ARCH"
elif [ "$DRY" = 1 ]; then
  log "gpu: dry run (GPU tests skip; the CUDA emulation runs the kernels)"
else
  fail "no GPU found (nvidia-smi); use --dry-run on a machine without one"
fi
COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
log "nvcc: $(nvcc --version 2>/dev/null | tail -1); cmake: $(cmake --version | head -1); commit: $COMMIT"
log "$(tr '\n' ';' <"$W/torch_facts.txt")"
pack

# ---- GoogleTest: the system's, else the carried sources ------------------------------------------
GT=""
if [ -f /usr/include/gtest/gtest.h ] && [ -z "${GTEST_FROM_SOURCE:-}" ]; then GT="system"
elif [ -d build/gtest-src ]; then
  if timeout 60 cmake -S build/gtest-src -B "$W/gt" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
       -DCMAKE_INSTALL_PREFIX="$W/gti" >"$W/gtest.log" 2>&1 \
     && timeout "$(budget 120)" ninja -C "$W/gt" -j "$JOBS" install >>"$W/gtest.log" 2>&1
  then GT="$W/gti"; log "gtest: built from build/gtest-src"
  else fail "gtest: build failed (gtest.log)"; fi
else fail "gtest: missing (carry build/gtest-src)"; fi

# ---- one build: C++ tests, GPU benchmark and the Python extension, CUDA for this GPU ---------------
# One configure and one ninja, so the library and the kernels compile once for all three; -k 0:
# a target that fails (the extension against an unexpected torch, say) does not stop the others.
B=${GPU_CHECK_BUILD_DIR:-$W/build}
WITH_PY=OFF
[ "$TORCH" != "not importable" ] && WITH_PY=ON
configure() {  # $1: ON/OFF for the Python extension
  local pfx=() tests=OFF
  [ -n "$GT" ] && tests=ON
  [ -n "$GT" ] && [ "$GT" != system ] && pfx=(-DCMAKE_PREFIX_PATH="$GT")
  timeout 90 cmake -S . -B "$B" -G Ninja -DDYNAMIQ_BUILD_PYTHON="$1" -DDYNAMIQ_BUILD_TESTS=$tests \
    -DDYNAMIQ_BUILD_BENCHMARKS=ON -DDYNAMIQ_CUDA=ON -DDYNAMIQ_CUDA_ARCHITECTURES="$ARCH" \
    -DPython_EXECUTABLE="$(command -v "$PY")" "${pfx[@]}" >"$W/configure.log" 2>&1
}
if [ -n "${GPU_CHECK_BUILD_DIR:-}" ] && [ -x "$B/dynamiq_tests" ]; then
  log "build: reusing $B"
  WITH_PY=OFF  # (a dry run in CI: the installed extension is reused below)
else
  ok=0
  if configure "$WITH_PY"; then ok=1
  elif [ "$WITH_PY" = ON ]; then
    log "configure with the Python extension failed ($(grep -m1 -iE 'error|could not' "$W/configure.log")); again without"
    cp "$W/configure.log" "$W/configure_with_python.log"; rm -rf "$B"; WITH_PY=OFF
    configure OFF && ok=1
  fi
  if [ $ok = 1 ]; then
    log "configure: ok ($(grep -o 'CUDA architectures .*' "$W/configure.log" | head -1); $(grep -o 'curand [^ ]* [^ ]*' "$W/configure.log" | head -1); python extension $WITH_PY)"
    targets=()
    [ -n "$GT" ] && targets+=(dynamiq_tests)
    grep -q '^build bench_cuda:' "$B/build.ninja" 2>/dev/null && targets+=(bench_cuda)
    [ "$WITH_PY" = ON ] && targets+=(_C)
    [ "$DRY" = 1 ] && targets+=(dynamiq_cuda_emu_tests bench_cuda_emu)
    cap=240; [ "$DRY" = 1 ] && cap=1500  # (16 cores on the GPU machine; a dry run may have 2)
    timeout "$(budget $cap 150)" ninja -C "$B" -k 0 -j "$JOBS" "${targets[@]}" >"$W/build.log" 2>&1; rc=$?
    built=(); for t in "${targets[@]}"; do [ -e "$B/$t" ] || compgen -G "$B/$t*.so" >/dev/null && built+=("$t"); done
    if [ $rc -eq 0 ]; then log "build: ok (${built[*]})"
    else fail "build: rc=$rc, built: ${built[*]:-nothing} of ${targets[*]} (build_tail.log)"; tail -80 "$W/build.log" >"$W/build_tail.log"; fi
  else
    fail "configure: failed (configure.log)"; tail -40 "$W/configure.log" >>"$SUMMARY"
  fi
fi
T="$B/dynamiq_tests"
pack

# ---- every GPU test in a process of its own ----------------------------------------------------
declare -A RESULT=()
if [ -x "$T" ]; then
  pass=0; nfail=0; skipn=0
  for t in $(timeout 30 "$T" --gtest_list_tests --gtest_filter='Cuda*' | awk '/^[^ ]/{s=$1; next} {print s $1}'); do
    have_time 60 || { skip "gpu tests after $t" "time"; break; }
    t0=$SECONDS
    timeout "$(budget 60)" "$T" --gtest_filter="$t" >"$W/test_$t.log" 2>&1; rc=$?
    if grep -q "\[  SKIPPED \] 1 test" "$W/test_$t.log"; then r=skipped; skipn=$((skipn + 1))
    elif [ $rc -eq 0 ]; then r=passed; pass=$((pass + 1)); else r="FAILED(rc=$rc)"; nfail=$((nfail + 1)); fi
    RESULT[$t]=$r
    echo "  $t: $r ($((SECONDS - t0)) s)" >>"$SUMMARY"
  done
  log "gpu tests: $pass passed, $nfail failed, $skipn skipped"
  [ "$nfail" -gt 0 ] && FAILED=$((FAILED + 1))
  [ "$HAVE_GPU" = 1 ] && [ "$pass" -eq 0 ] && fail "no GPU test passed on a GPU machine"
  if [ "$DRY" = 1 ] && [ -x "$B/dynamiq_cuda_emu_tests" ]; then
    timeout "$(budget 600)" "$B/dynamiq_cuda_emu_tests" --gtest_brief=1 --gtest_filter="${GPU_CHECK_EMU_FILTER:-*}" >"$W/emu_tests.log" 2>&1
    rc=$?; log "CUDA emulation tests: rc=$rc ($(grep -E '^\[  PASSED|FAILED TEST' "$W/emu_tests.log" | head -2 | tr '\n' ' '))"
    [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
  fi
elif [ -n "$GT" ]; then
  fail "no test binary"
fi
pack

# ---- GPU codec benchmark (CUDA events against a device-to-device copy of the same bytes) --------------
# On a GPU: 64 and 256 MiB float32 and bf16 buckets (GPU_CHECK_BENCH_ARGS to change, e.g. "--mib 64"),
# each operation's time as a fraction of a copy with issue 41's targets and PASS/MISS, then the host
# time per collective; in a dry run the same program on the CUDA emulation with a 256 KiB bucket
# (bench_cuda_emu --dry-run: it runs, its times mean nothing, its verdicts read "emulated"). A MISS
# does not fail the check (the targets are the kernels' goals; the summary counts them). Until a GPU
# has run it, scripts/kernel_report.sh's roofline estimate stands in for these numbers.
KERNEL_TABLE="(not run)"
BENCH=""
if [ "$HAVE_GPU" = 1 ] && [ -x "$B/bench_cuda" ]; then BENCH="$B/bench_cuda"
elif [ "$DRY" = 1 ] && [ -x "$B/bench_cuda_emu" ]; then BENCH="$B/bench_cuda_emu"; fi
if [ -n "$BENCH" ] && have_time 60; then
  BENCH_ARGS=${GPU_CHECK_BENCH_ARGS:-}
  [ "$HAVE_GPU" = 0 ] && BENCH_ARGS="--dry-run"
  # under the load recorder (python/dynamiq/_load.py: load average and other processes' CPU share
  # before, during and after; its two "# load" lines end the log, "LOADED" in the summary's line)
  # shellcheck disable=SC2086
  timeout "$(budget 150)" "$PY" python/dynamiq/_load.py --json "$W/bench_cuda_load.json" -- \
    "$BENCH" $BENCH_ARGS >"$W/bench_cuda.log" 2>&1
  rc=$?; log "gpu benchmark ($(basename "$BENCH") $BENCH_ARGS): rc=$rc, targets: $(grep -c ' PASS$' "$W/bench_cuda.log") PASS, $(grep -c ' MISS$' "$W/bench_cuda.log") MISS$([ "$HAVE_GPU" = 0 ] && echo ' (emulated: no verdict)'); load: $(sed -n 's/^# load verdict: //p' "$W/bench_cuda.log" | tail -1 | cut -c1-120)"
  [ $rc -eq 0 ] && KERNEL_TABLE=$(cat "$W/bench_cuda.log") || FAILED=$((FAILED + 1))
  # the rows (bench_cuda.cu's header): op dtype MiB mode op ms GB/s %copy target verdict;
  # host dtype KiB mode wall_ms cpu_ms target verdict
  [ $rc -eq 0 ] && awk '$1 == "op" && NF == 10 {printf "  %s %s MiB %s %s: %s ms, %s GB/s, %s%% of copy (target %s: %s)\n", $2, $3, $4, $5, $6, $7, $8, $9, $10}
    $1 == "host" && NF == 8 {printf "  host %s %s KiB %s: %s ms wall, %s ms CPU per collective (target %s: %s)\n", $2, $3, $4, $5, $6, $7, $8}' \
    "$W/bench_cuda.log" >>"$SUMMARY"
elif [ -n "$BENCH" ]; then
  skip "gpu benchmark" "time"
elif [ "$DRY" = 1 ] || [ "$HAVE_GPU" = 1 ]; then
  fail "gpu benchmark: no bench_cuda$([ "$DRY" = 1 ] && echo _emu) binary in $B"
fi
pack

# ---- the one-GPU Python tests, on the extension built above -------------------------------------
PYRES="(not run)"
PYPATH=""
if [ "$DRY" = 1 ] && [ -n "${GPU_CHECK_PYTHON:-}" ] && "$PY" -c "import dynamiq" >/dev/null 2>&1; then
  PYPATH="(installed)"
  log "python extension: reusing the installed build ($PY)"
elif compgen -G "$B/_C*.so" >/dev/null; then
  mkdir -p "$W/pkg/dynamiq" && cp python/dynamiq/*.py "$W/pkg/dynamiq/" && cp "$B"/_C*.so "$W/pkg/dynamiq/"
  [ -f "$B/_build_info.py" ] && cp "$B/_build_info.py" "$W/pkg/dynamiq/"
  PYPATH="$W/pkg"
  log "python extension: built against torch $TORCH"
fi
if [ -z "$PYPATH" ]; then
  if [ "$TORCH" = "not importable" ]; then skip "python gpu tests" "no torch for $PY"
  else fail "python gpu tests: no extension (build.log)"; fi
elif have_time 60; then
  PP="$PYPATH"; [ "$PP" = "(installed)" ] && PP=""
  TO=(); "$PY" -c "import pytest_timeout" >/dev/null 2>&1 && TO=(--timeout=120)
  # SIGINT first: pytest then prints its summary and flushes what it has
  PYTHONUNBUFFERED=1 PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}" timeout -s INT -k 15 "$(budget 200 30)" \
    "$PY" -m pytest tests/python/test_gpu_staging.py tests/python/test_nccl.py -m gpu -rA -p no:cacheprovider "${TO[@]}" \
    >"$W/py_tests.log" 2>&1
  rc=$?; PYRES=$(grep -E '^=+ .*(passed|failed|skipped|error|no tests ran).* =+$' "$W/py_tests.log" | tail -1)
  PYRES=${PYRES:-$(tail -1 "$W/py_tests.log")}
  log "python gpu tests: rc=$rc ($PYRES)"
  if [ "$HAVE_GPU" = 1 ]; then
    # on a GPU, tests that all skip are a failure too
    { [ $rc -eq 0 ] && echo "$PYRES" | grep -qE '[0-9]+ passed'; } || FAILED=$((FAILED + 1))
  else
    # 5: no test collected (fine only in a dry run, where they are deselected by their skip)
    { [ $rc -eq 0 ] || [ $rc -eq 5 ]; } || FAILED=$((FAILED + 1))
  fi
else
  skip "python gpu tests" "time"
fi
pack

# ---- NCCL: can two ranks share this one GPU? (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1) ------
# A fact for the record, not a pass/fail: older NCCL refuses ("Duplicate GPU detected").
if [ "$HAVE_GPU" = 1 ] && have_time 40; then
  timeout "$(budget 40)" "$PY" scripts/gpu/nccl_two_ranks.py >"$W/nccl2.log" 2>&1; rc=$?
  why=$(grep -m1 -iE 'Duplicate GPU|multiple ranks' "$W/nccl2.log" || grep -E 'Error' "$W/nccl2.log" | tail -1)
  log "nccl two ranks on one GPU: rc=$rc; $(grep -c 'want' "$W/nccl2.log") rank lines; $(echo "$why" | cut -c1-160)"
elif [ "$HAVE_GPU" = 1 ]; then
  skip "nccl two ranks" "time"
fi
pack

# ---- compute-sanitizer on the kernel tests, with the time left ------------------------------------
if [ -x "$T" ] && [ "$HAVE_GPU" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck; do
    case $tool in
      # memcheck: every kernel test, the device parse of malformed messages included
      memcheck) F='CudaDynamiq.*:CudaBitsplit.*:CudaLossless.*:CudaLosslessDecode.*:CudaLosslessEscapes.*' ;;
      # shared memory and barriers: the kernels that use them, on one case each
      *) F='CudaDynamiq.*:CudaBitsplit.*:CudaLosslessDecode.EveryFormat*:CudaLosslessDecode.Malformed*' ;;
    esac
    have_time 45 || { skip "sanitizer $tool" "time"; continue; }
    timeout "$(budget 150)" compute-sanitizer --tool $tool --print-limit 20 --error-exitcode 9 "$T" \
      --gtest_filter="$F" >"$W/sanitizer_$tool.log" 2>&1; rc=$?
    summary=$(grep -m1 -E '(ERROR|RACECHECK|SYNCCHECK) SUMMARY' "$W/sanitizer_$tool.log")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then skip "sanitizer $tool" "timed out; $summary"
    elif grep -qiE 'not supported|\[  SKIPPED \]' "$W/sanitizer_$tool.log"; then
      fail "sanitizer $tool: tests skipped or device not supported under the tool (sanitizer_$tool.log)"
    else
      log "sanitizer $tool: rc=$rc ($summary)"
      [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
    fi
    pack
  done
elif [ "$HAVE_GPU" = 1 ]; then
  skip "compute-sanitizer" "not installed, or no test binary"
fi

# ---- the CPU tests on this machine's CPU (the reference), with the time left --------------------
if [ -x "$T" ] && have_time 40; then
  timeout "$(budget 300)" "$T" --gtest_brief=1 --gtest_filter="${GPU_CHECK_CPU_FILTER:--Cuda*:FloatBitsSweep.*}" >"$W/cpu_tests.log" 2>&1
  rc=$?
  if [ $rc -eq 124 ]; then skip "cpu tests" "timed out"
  else
    log "cpu tests on this machine's CPU: rc=$rc ($(grep -E '^\[  PASSED|FAILED TEST' "$W/cpu_tests.log" | head -2 | tr '\n' ' '))"
    [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
  fi
elif [ -x "$T" ]; then
  skip "cpu tests" "time"
fi

# ---- the record ---------------------------------------------------------------------------------
if [ "$FAILED" -gt 0 ]; then VERDICT="$FAILED stage(s) failed"
elif [ "${#SKIPPED[@]}" -gt 0 ] && [ "$HAVE_GPU" = 1 ]; then VERDICT="INCOMPLETE: skipped ${SKIPPED[*]}"
else VERDICT="all stages passed"; fi
log "done in $((SECONDS - S)) s: $VERDICT"
{
  echo "# GPU check: $CARD"
  echo
  echo "card: $CARD · driver: $DRIVER · torch: $TORCH · NCCL: $NCCL · date: $(date -u +%Y-%m-%dT%H:%MZ) · commit: $COMMIT · mode: $([ "$DRY" = 1 ] && echo dry-run || echo gpu) · command: \`bash scripts/gpu_check.sh$([ "$DRY" = 1 ] && echo ' --dry-run')\` · verdict: $VERDICT"
  echo
  echo "## Tests"
  echo
  echo "| test | result |"
  echo "|---|---|"
  for t in $(printf '%s\n' "${!RESULT[@]}" | sort); do echo "| $t | ${RESULT[$t]} |"; done
  echo
  echo "Python one-GPU tests: $PYRES"
  echo
  echo "## Kernels"
  echo
  echo '```'
  echo "$KERNEL_TABLE"
  echo '```'
  echo
  echo "## Stages"
  echo
  echo '```'
  cat "$SUMMARY"
  echo '```'
} >"$W/record.md"
pack
echo "== summary"; cat "$SUMMARY"
[ "$FAILED" -eq 0 ] || exit 1
[ "$VERDICT" = "all stages passed" ] || exit 3
