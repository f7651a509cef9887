#!/usr/bin/env bash
# Every test, C++ and Python. Does all set-up first (scripts/setup.sh).
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -k ring    # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
JOBS=${JOBS:-2}
# a stage header with the minutes since the start (set-up included), to see where CI time goes
stage() { echo "== $1 [$((SECONDS / 60))m$((SECONDS % 60))s]"; }

# Two runs side by side (2 cores; the single-threaded CUDA emulation next to a
# run that is mostly single-threaded too): the background run's output goes to a
# log that is printed, and its failure fails the script, once the foreground run is done.
BG_PID=""
trap '[ -n "$BG_PID" ] && kill "$BG_PID" 2>/dev/null; true' EXIT
bg_start() { local log=$1; shift; "$@" >"$log" 2>&1 & BG_PID=$!; }
bg_finish() {
  local log=$1 rc=0
  wait "$BG_PID" || rc=$?
  BG_PID=""
  # (ASan warns that it does not fully support swapcontext, which the emulator uses on ISAs other
  # than x86-64; the one line is dropped)
  grep -v "ASan doesn't fully support makecontext" "$log" || true
  [ "$rc" -eq 0 ] || { echo "FAILED (exit $rc): the run logged above"; exit "$rc"; }
}

stage "C++ (GoogleTest, torch-free; CUDA kernels compiled when nvcc is found, GPU tests skip without a GPU)"
# ccache as in setup.sh, for this build only: the library's objects come from the extension's
# build, which must be compiled by the same name (ccache hashes it: the extension's /usr/bin/g++
# and CMake's default /usr/bin/c++, the same program on Debian, missed every C++ object). Not for
# the builds below, which share nothing: ccache's misses cost the ASan build 4:58 against 4:22.
CCACHE_ARGS=()
# shellcheck source=scripts/ccache_env.sh
if source scripts/ccache_env.sh; then
  CCACHE_ARGS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  ext_cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' build/cp*/CMakeCache.txt 2>/dev/null | head -1 || true)
  [ -z "$ext_cxx" ] || CCACHE_ARGS+=("-DCMAKE_CXX_COMPILER=$ext_cxx")
fi
# where nvcc is present, curand's headers must be found too (the device code's Philox and the
# CPU test that checks philox.h against it)
REQUIRE_CURAND=OFF; command -v nvcc >/dev/null 2>&1 && REQUIRE_CURAND=ON
cmake -S . -B build/cpp -G Ninja "${CCACHE_ARGS[@]}" -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_BUILD_TESTS=ON \
  -DDYNAMIQ_BUILD_BENCHMARKS=ON -DDYNAMIQ_CUDA=AUTO -DDYNAMIQ_REQUIRE_CURAND=$REQUIRE_CURAND >build/cpp-configure.log 2>&1 \
  || { cat build/cpp-configure.log; exit 1; }
grep "dynamiq: CUDA\|dynamiq: curand" build/cpp-configure.log || true  # ON: nvcc compiles the CUDA code in this run
ninja -C build/cpp -j "$JOBS" >build/cpp-build.log 2>&1 || { tail -60 build/cpp-build.log; exit 1; }
bash scripts/check_avx512_isolation.sh build/cpp  # nothing AVX-512 the rest of the library could bind to
stage "C++ tests; beside them the CUDA kernels and GPU tests on the CPU emulation of CUDA (threads of a
   block in index order), then the C++ tests again with codec calls split over 2 threads (DYNAMIQ_CPU_THREADS=2;
   results must not change)"
# The emulation took 89 CPU s until its fibers switched without a system call, 11 s since
# (2026-11-28): the 2-thread pass (27 CPU s) now follows it beside the first pass (43 CPU s)
# instead of following that pass. The suites share no port or file.
cpp_beside() {
  build/cpp/dynamiq_cuda_emu_tests --gtest_brief=1 || return
  echo "-- codec calls split over 2 threads (DYNAMIQ_CPU_THREADS=2):"
  # the second pass: the suites that run codecs (the split is inside codec calls); not the
  # scheduling, transport and fault suites, which took 28 of its 58 s (2-core AMD guest)
  DYNAMIQ_CPU_THREADS=2 build/cpp/dynamiq_tests --gtest_brief=1 \
    --gtest_filter='-FloatBitsSweep.*:Cuda*:Faults.*:SendWindow.*:Timeline.*:SendAhead.*:Failure.*:Rounds.*:NcclOrder.*:RendezvousSends.*:SchedulePhases.*:Schedule.*:InprocTransport.*:BufferPool.*:ExecutorGuard.*:HeaderCorruption.*:Header.*:ConfigFingerprint.*:Registry.*:Philox.*:FloatBits.*'
}
bg_start build/cpp-beside-tests.log cpp_beside
build/cpp/dynamiq_tests --gtest_brief=1
echo "-- the CUDA emulation (index order), then the 2-thread pass:"
bg_finish build/cpp-beside-tests.log

# The fallback kernels without any x86 intrinsics (what a non-x86 host compiles: the per-element
# loops and the portable conversions that the vector paths otherwise replace), built for aarch64
# with Debian's cross compiler and run under QEMU (scripts/cross_aarch64.sh; until 2026-11-24 this
# stage was an x86 build with DYNAMIQ_CPU_ARCH empty, which the aarch64 one supersedes: same
# fallback code, plus another ISA, unsigned char and no SSE-guarded test helpers).
stage "C++ portable kernels on aarch64 (cross-built, run under qemu-aarch64): build and tests"
bash scripts/cross_aarch64.sh

# -O1 -g1 (line tables): on the 2-core AMD guest the build took 215 s instead of 389 s at
# RelWithDebInfo, the tests 26 s longer.
stage "C++ under AddressSanitizer + UBSan: build"
cmake -S . -B build/asan -G Ninja -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_BUILD_TESTS=ON -DDYNAMIQ_CUDA=OFF \
  -DDYNAMIQ_ASAN=ON -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" >build/asan-configure.log 2>&1 \
  || { cat build/asan-configure.log; exit 1; }
ninja -C build/asan -j "$JOBS" >build/asan-build.log 2>&1 || { tail -60 build/asan-build.log; exit 1; }
# All tests but the exhaustive float sweep; beside them the CUDA sources and GPU tests on the
# emulator with the threads of a block in *reversed* order (the index order ran above), so a
# kernel that depends on the order of its threads fails one of the two runs (the emulator's fiber
# switches tell ASan which stack they move to: it has reported nothing here).
stage "C++ under AddressSanitizer + UBSan: tests; beside them the CUDA emulation, threads in reversed order"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# The emulation beside the other tests (146 s): it took 233 s (fresh-clone run, 2-core AMD guest,
# 2026-11-26), 369 CPU s, until its fibers switched without a system call (swapcontext's signal
# mask, and ASan's interceptor clearing a 256 KiB stack's shadow per switch): 116 CPU s
# (2026-11-28). Sharding both did not pay then (two shards each: 3:49 for the stage against 3:53;
# four emulation shards and two others: 4:33).
bg_start build/asan-emu-tests.log env DYNAMIQ_CUDA_EMU_ORDER=reverse build/asan/dynamiq_cuda_emu_tests --gtest_brief=1
build/asan/dynamiq_tests --gtest_brief=1 --gtest_filter='-FloatBitsSweep.*:Cuda*'
echo "-- the CUDA emulation under ASan (reversed order):"
bg_finish build/asan-emu-tests.log

# Coverage-guided fuzzing of every decoder of received bytes (tests/fuzz, libFuzzer + ASan + UBSan,
# clang-19 from Debian, installed by the script if missing): each target 8 s from the seed corpus
# the build generates (nothing kept from earlier runs) with a fixed seed, two targets at a time;
# any finding fails the stage. Longer runs: bash scripts/fuzz.sh [seconds]. The clean build took
# 122 CPU s (clang 19, no ccache; about 1 min on 2 cores), the runs 4 x 8 s: about 1.6 min in all.
stage "Fuzzing: build (clang, ASan + UBSan) and every target 8 s, fixed seed"
FUZZ_JOBS=2 bash scripts/fuzz.sh --ci 8

# ~45 s on the 2-core guest: the wheel links what setup.sh compiled (same build directory)
stage "Wheel: pip wheel --no-build-isolation, a fresh venv with only torch and numpy, a 2-rank job outside the tree"
bash scripts/check_wheel.sh

# Two pytest-xdist workers (PYTEST_WORKERS=0: one process): the multi-process tests wait on each
# other's ranks, and one run left the 2 cores 30 % idle. Whole files per worker (loadfile):
# test_netbed.py's tests must not run beside each other (its comment says why; xdist_group marks
# do nothing under pytest 9.2 with xdist 3.8, which failed a CI run). 2-core AMD guest,
# 2026-11-26: one process 6:24 (in a CI run); standalone, 2 workers by test 5:03, by file 5:21.
stage "Python (pytest, multi-process Gloo on loopback; ${PYTEST_WORKERS:-2} workers)"
.venv/bin/python -m pytest tests/python -q --durations=8 -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"

# The GPU command (scripts/gpu_check.sh) without a GPU, so it is known to work before GPU time is
# spent on it: its stages on the builds above, a few tests each (all of them ran above).
stage "GPU check, dry run (scripts/gpu_check.sh --dry-run)"
GPU_CHECK_BUILD_DIR=build/cpp GPU_CHECK_PYTHON=.venv/bin/python GPU_CHECK_EMU_FILTER='CudaDynamiq.*' \
  GPU_CHECK_CPU_FILTER='WireGolden.*:PhiloxCurand.*' OUT=build/gpu_check_dry bash scripts/gpu_check.sh --dry-run \
  | tail -12
# the benchmark ran under the load recorder (python/dynamiq/_load.py), whose verdict is in its line
grep -q '^\[[0-9]*s\] gpu benchmark .*; load: \(quiet\|LOADED\)' build/gpu_check_dry/summary.txt \
  || { echo "FAILED: gpu_check.sh recorded no load for its benchmark (build/gpu_check_dry/summary.txt)"; exit 1; }
stage "all tests passed"
