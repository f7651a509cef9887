#!/usr/bin/env bash
# dynamiq's GPU check: one command for a machine with one NVIDIA GPU (H100/H200 class), nvcc,
# CMake, ninja and PyTorch, but no GoogleTest and no package registry. Done in about 8 minutes
# from a bare machine. From the project root:
#   rm -rf build/gtest-src && cp -r /usr/src/googletest build/gtest-src   # carry GoogleTest's sources
#   GPU_CHECK_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_check.sh
# and through the device tool: run(command="GPU_CHECK_COMMIT=<hash> bash scripts/gpu_check.sh",
#   carry=["build/gtest-src"], timeout_s=570)
#
#   --dry-run   the same stages without a GPU: the CUDA sources compiled, the GPU tests (which
#               skip) and the CUDA emulation's tests run in their place. CI runs it after the other
#               stages with GPU_CHECK_BUILD_DIR=build/cpp (reuse that build),
#               GPU_CHECK_PYTHON=.venv/bin/python (reuse the installed extension) and
#               GPU_CHECK_EMU_FILTER / GPU_CHECK_CPU_FILTER (gtest filters: a few tests, since CI ran
#               them all already).
#
# Writes into $OUT (default /tmp/gpu_check_out), as it goes: summary.txt (one line per stage and
# per GPU test), record.md (the run's record for experiments/results/gpu/: card, driver, torch,
# NCCL, date, commit, pass/fail per test, kernel table) and logs.tgz (every log). A stage is skipped
# when too little of DEADLINE_S (default 470 s) is left, so a timeout still leaves what finished.
#
# Stages: machine facts -> GoogleTest -> build (torch-free C++ tests and the GPU benchmark, for
# the GPU's own architecture) -> every Cuda* test in its own process (a sticky CUDA error must not
# hide the others) -> compute-sanitizer memcheck/racecheck/synccheck on the kernel tests -> the
# CPU tests on this machine's CPU (the reference) -> GPU codec benchmark -> the Python extension
# against this machine's torch and the one-GPU Python tests -> can two NCCL ranks share the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
S=$SECONDS
DRY=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n 2,25p "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $a (try --help)" >&2; exit 2 ;;
  esac
done
DEADLINE_S=${DEADLINE_S:-470}
[ "$DRY" = 1 ] && DEADLINE_S=${DEADLINE_S_DRY:-1800}  # no GPU window to fit in
OUT=${OUT:-/tmp/gpu_check_out}
W=${GPU_CHECK_WORK:-/tmp/gpu_check_work}
JOBS=$(nproc)
rm -rf "$W"; mkdir -p "$W" "$OUT"
SUMMARY="$W/summary.txt"
FAILED=0
log() { echo "[$((SECONDS - S))s] $*" | tee -a "$SUMMARY"; }
fail() { FAILED=$((FAILED + 1)); log "FAIL: $*"; }
left() { echo $((DEADLINE_S - (SECONDS - S))); }
have_time() { [ "$(left)" -ge "$1" ]; }
pack() {
  cp "$SUMMARY" "$OUT/summary.txt"
  [ -f "$W/record.md" ] && cp "$W/record.md" "$OUT/record.md"
  (cd "$W" && tar czf "$OUT/logs.tgz" --exclude=build --exclude=gt --exclude=gti --exclude=pybuild ./*.log ./*.txt ./*.md ./*.json 2>/dev/null)
}
trap 'pack' EXIT

# ---- machine facts -----------------------------------------------------------------------------
PY=${GPU_CHECK_PYTHON:-python3}
[ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
{ nvidia-smi; nvcc --version; cmake --version; ninja --version; lscpu | head -25
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
} >"$W/env.log" 2>&1
HAVE_GPU=0; ARCH=90; CARD="none"; DRIVER="-"
if [ "$DRY" = 0 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
  log "gpu: $CARD, driver $DRIVER, $(nvidia-smi --query-gpu=memory.total --format=csv,noheader | head -1), sm_$ARCH"
elif [ "$DRY" = 1 ]; then
  log "gpu: dry run (GPU tests skip; the CUDA emulation runs the kernels)"
else
  fail "no GPU found (nvidia-smi); use --dry-run on a machine without one"
fi
TORCH=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not importable")
NCCL=$("$PY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")' 2>/dev/null || echo "-")
COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
log "nvcc: $(nvcc --version 2>/dev/null | tail -1); cmake: $(cmake --version | head -1); torch: $TORCH; nccl: $NCCL; commit: $COMMIT"

# ---- GoogleTest: the system's, else the carried sources ------------------------------------------
GT=""
if [ -f /usr/include/gtest/gtest.h ] && [ -z "${GTEST_FROM_SOURCE:-}" ]; then GT="system"
elif [ -d build/gtest-src ]; then
  if cmake -S build/gtest-src -B "$W/gt" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
       -DCMAKE_INSTALL_PREFIX="$W/gti" >"$W/gtest.log" 2>&1 && ninja -C "$W/gt" -j "$JOBS" install >>"$W/gtest.log" 2>&1
  then GT="$W/gti"; log "gtest: built from build/gtest-src"
  else fail "gtest: build failed (gtest.log)"; fi
else fail "gtest: missing (carry build/gtest-src)"; fi

# ---- build: torch-free C++ tests and benchmarks, CUDA for this GPU -------------------------------
B=${GPU_CHECK_BUILD_DIR:-$W/build}
if [ -n "${GPU_CHECK_BUILD_DIR:-}" ] && [ -x "$B/dynamiq_tests" ]; then
  log "build: reusing $B"
elif [ -n "$GT" ]; then
  PFX=(); [ "$GT" != system ] && PFX=(-DCMAKE_PREFIX_PATH="$GT")
  if cmake -S . -B "$B" -G Ninja -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_BUILD_TESTS=ON -DDYNAMIQ_BUILD_BENCHMARKS=ON \
       -DDYNAMIQ_CUDA=ON -DDYNAMIQ_CUDA_ARCHITECTURES="$ARCH" "${PFX[@]}" >"$W/configure.log" 2>&1; then
    log "configure: ok ($(grep -o 'CUDA architectures .*' "$W/configure.log" | head -1); $(grep -o 'curand [^ ]* [^ ]*' "$W/configure.log" | head -1))"
    targets=(dynamiq_tests)
    grep -q "bench_cuda" "$B/build.ninja" 2>/dev/null && targets+=(bench_cuda)
    [ "$DRY" = 1 ] && targets+=(dynamiq_cuda_emu_tests bench_cuda_emu)
    if timeout $(( $(left) - 200 > 60 ? $(left) - 200 : 60 )) ninja -C "$B" -j "$JOBS" "${targets[@]}" >"$W/build.log" 2>&1
    then log "build: ok (${targets[*]})"
    else fail "build: failed or timed out"; tail -60 "$W/build.log" >"$W/build_tail.log"; fi
  else fail "configure: failed (configure.log)"; tail -40 "$W/configure.log" >>"$SUMMARY"; fi
fi
T="$B/dynamiq_tests"

# ---- every GPU test in a process of its own ----------------------------------------------------
declare -A RESULT=()
if [ -x "$T" ]; then
  pass=0; nfail=0; skip=0
  for t in $("$T" --gtest_list_tests --gtest_filter='Cuda*' | awk '/^[^ ]/{s=$1; next} {print s $1}'); do
    have_time 150 || { log "gpu tests: stopped early (time)"; break; }
    timeout 120 "$T" --gtest_filter="$t" >"$W/test_$t.log" 2>&1; rc=$?
    if grep -q "\[  SKIPPED \] 1 test" "$W/test_$t.log"; then r=skipped; skip=$((skip + 1))
    elif [ $rc -eq 0 ]; then r=passed; pass=$((pass + 1)); else r="FAILED(rc=$rc)"; nfail=$((nfail + 1)); fi
    RESULT[$t]=$r
    echo "  $t: $r" >>"$SUMMARY"
  done
  log "gpu tests: $pass passed, $nfail failed, $skip skipped"
  [ "$nfail" -gt 0 ] && FAILED=$((FAILED + 1))
  [ "$HAVE_GPU" = 1 ] && [ "$pass" -eq 0 ] && fail "no GPU test passed on a GPU machine"
  if [ "$DRY" = 1 ] && [ -x "$B/dynamiq_cuda_emu_tests" ]; then
    timeout 600 "$B/dynamiq_cuda_emu_tests" --gtest_brief=1 --gtest_filter="${GPU_CHECK_EMU_FILTER:-*}" >"$W/emu_tests.log" 2>&1
    rc=$?; log "CUDA emulation tests: rc=$rc ($(grep -E '^\[  PASSED|FAILED TEST' "$W/emu_tests.log" | head -2 | tr '\n' ' '))"
    [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
  fi
  if [ "$HAVE_GPU" = 1 ] && command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck synccheck; do
      have_time 120 || { log "sanitizer $tool: skipped (time)"; continue; }
      timeout 90 compute-sanitizer --tool $tool --print-limit 20 --error-exitcode 9 "$T" \
        --gtest_filter='CudaDynamiq.*:CudaBitsplit.*:CudaLossless.*' >"$W/sanitizer_$tool.log" 2>&1
      rc=$?; log "sanitizer $tool: rc=$rc ($(grep -m1 'ERROR SUMMARY' "$W/sanitizer_$tool.log"))"
      [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
    done
  fi
  if have_time 100; then
    timeout 300 "$T" --gtest_brief=1 --gtest_filter="${GPU_CHECK_CPU_FILTER:--Cuda*:FloatBitsSweep.*}" >"$W/cpu_tests.log" 2>&1
    rc=$?; log "cpu tests on this machine's CPU: rc=$rc ($(grep -E '^\[  PASSED|FAILED TEST' "$W/cpu_tests.log" | head -2 | tr '\n' ' '))"
    [ $rc -eq 0 ] || FAILED=$((FAILED + 1))
  fi
else
  fail "no test binary"
fi

# ---- GPU codec benchmark (CUDA events against a device-to-device copy of the same bytes) --------------
# On a GPU: 64 and 256 MiB float32 buckets (GPU_CHECK_BENCH_ARGS to change); in a dry run the
# same program on the CUDA emulation with a 256 KiB bucket (bench_cuda_emu --dry-run: it runs, its
# times mean nothing).
KERNEL_TABLE="(not run)"
BENCH=""
if [ "$HAVE_GPU" = 1 ] && [ -x "$B/bench_cuda" ]; then BENCH="$B/bench_cuda"
elif [ "$DRY" = 1 ] && [ -x "$B/bench_cuda_emu" ]; then BENCH="$B/bench_cuda_emu"; fi
if [ -n "$BENCH" ] && have_time 90; then
  BENCH_ARGS=${GPU_CHECK_BENCH_ARGS:-}
  [ "$HAVE_GPU" = 0 ] && BENCH_ARGS="--dry-run"
  # shellcheck disable=SC2086
  timeout 80 "$BENCH" $BENCH_ARGS >"$W/bench_cuda.log" 2>&1
  rc=$?; log "gpu benchmark ($(basename "$BENCH") $BENCH_ARGS): rc=$rc"
  [ $rc -eq 0 ] && KERNEL_TABLE=$(cat "$W/bench_cuda.log") || FAILED=$((FAILED + 1))
  [ $rc -eq 0 ] && grep -E "^[0-9]" "$W/bench_cuda.log" | awk 'NF == 6 {printf "  %s MiB %s %s: %s GB/s (%s%% of copy)\n", $1, $2, $3, $5, $6}
    NF == 3 {printf "  %s KiB %s: %s ms per collective (host time, 2 ranks in one process)\n", $1, $2, $3}' >>"$SUMMARY"
elif [ "$DRY" = 1 ] || [ "$HAVE_GPU" = 1 ]; then
  fail "gpu benchmark: no bench_cuda$([ "$DRY" = 1 ] && echo _emu) binary in $B"
fi

# ---- the Python extension against this machine's torch, and the one-GPU Python tests --------------
PYRES="(not run)"
if have_time 150 && "$PY" -c "import torch, pybind11" >/dev/null 2>&1; then
  PYPATH=""
  if [ "$DRY" = 1 ] && [ -n "${GPU_CHECK_PYTHON:-}" ] && "$PY" -c "import dynamiq" >/dev/null 2>&1; then
    log "python extension: reusing the installed build ($PY)"
  else
    PB="$W/pybuild"
    if cmake -S . -B "$PB" -G Ninja -DDYNAMIQ_BUILD_PYTHON=ON -DDYNAMIQ_CUDA=ON -DDYNAMIQ_CUDA_ARCHITECTURES="$ARCH" \
         -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
         >"$W/py_configure.log" 2>&1 \
       && timeout $(( $(left) - 90 > 60 ? $(left) - 90 : 60 )) ninja -C "$PB" -j "$JOBS" _C >"$W/py_build.log" 2>&1; then
      mkdir -p "$W/pkg/dynamiq" && cp python/dynamiq/*.py "$W/pkg/dynamiq/" && cp "$PB"/_C*.so "$W/pkg/dynamiq/"
      [ -f "$PB/_build_info.py" ] && cp "$PB/_build_info.py" "$W/pkg/dynamiq/"
      PYPATH="$W/pkg"
      log "python extension: built against torch $TORCH"
    else
      fail "python extension: build failed (py_configure.log, py_build.log)"; tail -40 "$W/py_build.log" >"$W/py_build_tail.log" 2>/dev/null
    fi
  fi
  if have_time 60; then
    PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" timeout $(( $(left) - 40 > 30 ? $(left) - 40 : 30 )) \
      "$PY" -m pytest tests/python -q -m gpu -p no:cacheprovider >"$W/py_tests.log" 2>&1
    rc=$?; PYRES=$(tail -1 "$W/py_tests.log"); log "python gpu tests: rc=$rc ($PYRES)"
    # 5: no test collected (fine only in a dry run, where they are deselected by their skip)
    { [ $rc -eq 0 ] || { [ $rc -eq 5 ] && [ "$DRY" = 1 ]; }; } || FAILED=$((FAILED + 1))
  fi
else
  log "python stage: skipped (time, or no torch/pybind11 for $PY)"
fi

# ---- NCCL: can two ranks share this one GPU? (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1) ------
if [ "$HAVE_GPU" = 1 ] && have_time 60; then
  timeout 50 "$PY" scripts/gpu/nccl_two_ranks.py >"$W/nccl2.log" 2>&1
  log "nccl two ranks on one GPU: rc=$? ($(grep -m1 '^nccl' "$W/nccl2.log")); $(grep -c 'want' "$W/nccl2.log") rank lines"
fi

# ---- the record ---------------------------------------------------------------------------------
{
  echo "# GPU check: $CARD"
  echo
  echo "card: $CARD · driver: $DRIVER · torch: $TORCH · NCCL: $NCCL · date: $(date -u +%Y-%m-%dT%H:%MZ) · commit: $COMMIT · mode: $([ "$DRY" = 1 ] && echo dry-run || echo gpu) · command: \`bash scripts/gpu_check.sh$([ "$DRY" = 1 ] && echo ' --dry-run')\`"
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
log "done in $((SECONDS - S)) s: $([ "$FAILED" -eq 0 ] && echo "all stages passed" || echo "$FAILED stage(s) failed")"
echo "== summary"; cat "$SUMMARY"
[ "$FAILED" -eq 0 ]
