#!/usr/bin/env bash
# The compiler's account of every CUDA kernel of the library, without a GPU (issue 41, item 4):
#   bash scripts/kernel_report.sh [--check] [--loops] [--build-dir build/cpp] [--out DIR]
#
# 1. Takes the compile flags of every CUDA source of the library (csrc/**/*.cu) from the build's
#    compile_commands.json (CMakeLists.txt exports it), so the report cannot drift from the build,
#    and compiles each for sm_90 only, device code only (-cubin), with -Xptxas -v.
# 2. Reads cuobjdump -res-usage and -sass of each cubin.
# 3. Records the launch configurations the launchers make (threads per block, dynamic shared bytes)
#    by running the GPU benchmark on the CUDA emulation (bench_cuda_emu --dry-run, default
#    parameters), then a few emulated GPU tests for the kernels the benchmark does not launch, with
#    DYNAMIQ_CUDA_EMU_LAUNCH_LOG set (kernels/base/cuda/launch.h writes it).
# 4. Prints per kernel: registers, stack frame, spills, shared memory, launch configuration,
#    theoretical occupancy on an H100, SASS instructions per value, bytes per value and a roofline
#    ESTIMATE of its throughput as a fraction of a device copy (scripts/kernel_report.py says how).
#
# --check: exits 1 when a hot kernel of scripts/kernel_budgets.txt spills, has a stack frame, has
# theoretical occupancy under 50 % at its launch configuration or exceeds its instructions-per-value
# budget (or a hot budget line matches no kernel, or a hot kernel was not launched by the recording
# run). --loops: every innermost loop of each budgeted kernel (size, global bytes per pass).
#
# Needs: nvcc (13), cuobjdump (PATH, beside nvcc, or the one in .venv's triton or nvidia wheels;
# `pip install nvidia-cuda-cuobjdump` brings one), c++filt, python3, and a build directory configured
# with CUDA and the tests and benchmarks on (scripts/test.sh's build/cpp);
# ninja brings bench_cuda_emu and dynamiq_cuda_emu_tests up to date. Outputs (cubins, ptxas logs,
# SASS, launch logs) go to --out (default: <build dir>/kernel_report).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/cpp
OUTDIR=""
PYARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --check) PYARGS+=(--check) ;;
    --loops) PYARGS+=(--loops) ;;
    --build-dir) BUILD=$2; shift ;;
    --out) OUTDIR=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "kernel_report.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
OUTDIR=${OUTDIR:-$BUILD/kernel_report}
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PATH="$PWD/.venv/bin:$PATH"  # cmake and ninja where the system has none

die() { echo "kernel_report.sh: $*" >&2; exit 2; }
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -n "$NVCC" ] || die "nvcc not found"
CUOBJDUMP=${CUOBJDUMP:-}
if [ -z "$CUOBJDUMP" ]; then
  for c in "$(command -v cuobjdump || true)" "$(dirname "$(readlink -f "$NVCC")")/cuobjdump" \
           .venv/lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump \
           .venv/lib/python3*/site-packages/nvidia/cuda_cuobjdump/bin/cuobjdump \
           .venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump; do
    if [ -n "$c" ] && [ -x "$c" ]; then CUOBJDUMP=$c; break; fi
  done
fi
[ -n "$CUOBJDUMP" ] || die "cuobjdump not found (set CUOBJDUMP=, or: .venv/bin/pip install nvidia-cuda-cuobjdump)"
FILT=$(command -v c++filt || command -v cu++filt || true)
[ -n "$FILT" ] || die "c++filt not found (binutils)"

[ -f "$BUILD/CMakeCache.txt" ] || die "no configured build in $BUILD (configure it as scripts/test.sh does, with nvcc on the PATH: docs/hardware.md, 'CUDA code without a GPU')"
if [ ! -f "$BUILD/compile_commands.json" ]; then  # (a build configured before CMakeLists.txt exported it)
  cmake -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$BUILD" >/dev/null || die "cmake could not re-configure $BUILD"
fi
grep -q '"file": ".*/csrc/.*\.cu"' "$BUILD/compile_commands.json" \
  || die "$BUILD compiles no CUDA source (nvcc not found when it was configured? DYNAMIQ_CUDA=ON)"
rm -rf "$OUTDIR"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)

# the launch configurations, as the launchers make them (on the CUDA emulation): first the GPU
# benchmark's codec operations at its default parameters; then, for the kernels it does not reach
# (bitsplit's decompress-accumulate, lossless zip and plain5: formats its data never picks; the
# reduce-scatter sink's, CudaSinkSum), a few emulated GPU tests (their parameters are the tests',
# the "from" column says which run)
REC=()
if grep -q '^build bench_cuda_emu:' "$BUILD/build.ninja" 2>/dev/null; then
  ninja -C "$BUILD" bench_cuda_emu dynamiq_cuda_emu_tests >"$OUTDIR/ninja.log" 2>&1 \
    || { tail -30 "$OUTDIR/ninja.log"; die "could not build bench_cuda_emu and dynamiq_cuda_emu_tests"; }
  REC+=(--record "bench=$BUILD/bench_cuda_emu --dry-run --no-host --dtype f32,bf16")
  REC+=(--record "tests=$BUILD/dynamiq_cuda_emu_tests --gtest_brief=1 --gtest_filter=CudaBitsplit.*:CudaLossless.GpuMessages*:CudaSinkSum.*")
else
  echo "kernel_report.sh: $BUILD has no bench_cuda_emu (configure with -DDYNAMIQ_BUILD_TESTS=ON -DDYNAMIQ_BUILD_BENCHMARKS=ON): no launch configurations, no occupancy" >&2
fi

echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes'), $("$NVCC" --version | tail -1), $(basename "$CUOBJDUMP") $("$CUOBJDUMP" --version | grep -o 'release [0-9.]*')"
exec "$PY" scripts/kernel_report.py --compile-commands "$BUILD/compile_commands.json" --out-dir "$OUTDIR" \
  "${REC[@]}" --nvcc "$NVCC" --cuobjdump "$CUOBJDUMP" --cxxfilt "$FILT" --jobs "$(nproc)" "${PYARGS[@]}"
