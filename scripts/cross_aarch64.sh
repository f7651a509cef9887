#!/usr/bin/env bash
# The torch-free C++ core and its GoogleTests built for 64-bit Arm Linux
# (aarch64) with Debian's cross compiler, and run under QEMU user-mode
# emulation: the portable kernels (no x86 intrinsics at all) on another ISA,
# where char is unsigned and gcc has no _Float16 in C++. QEMU runs the
# instructions, not an Arm machine's timing or memory ordering (on an x86 host
# it keeps x86's stronger ordering), so this checks results, not speed or races.
#   bash scripts/cross_aarch64.sh                  # build, then every test but the exhaustive-sweep ones
#   bash scripts/cross_aarch64.sh --gtest_filter=X # extra arguments go to the test binary
# Installs g++-aarch64-linux-gnu, qemu-user and googletest's sources (Debian) if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
JOBS=${JOBS:-2}
log() { printf '[aarch64] %s\n' "$*"; }

apt_pkgs=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || apt_pkgs+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || apt_pkgs+=(qemu-user)
[ -f /usr/src/googletest/CMakeLists.txt ] || apt_pkgs+=(googletest)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${apt_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}" >/tmp/dynamiq-apt-aarch64.log 2>&1; then
    $SUDO apt-get update >>/tmp/dynamiq-apt-aarch64.log 2>&1
    $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}" >>/tmp/dynamiq-apt-aarch64.log 2>&1 \
      || { cat /tmp/dynamiq-apt-aarch64.log; exit 1; }
  fi
fi

TC="$PWD/cmake/aarch64-linux-gnu.cmake"
B=build/aarch64
mkdir -p "$B"
# GoogleTest for aarch64, from Debian's sources (the libgtest-dev libraries are x86)
if [ ! -f "$B/gtest-install/lib/cmake/GTest/GTestConfig.cmake" ]; then
  log "building GoogleTest for aarch64"
  cmake -S /usr/src/googletest -B "$B/gtest" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$TC" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$PWD/$B/gtest-install" >"$B/gtest.log" 2>&1 \
    && ninja -C "$B/gtest" install >>"$B/gtest.log" 2>&1 || { tail -40 "$B/gtest.log"; exit 1; }
fi
log "building dynamiq_tests for aarch64"
cmake -S . -B "$B/core" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$TC" \
  -DGTest_DIR="$PWD/$B/gtest-install/lib/cmake/GTest" -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_BUILD_TESTS=ON \
  -DDYNAMIQ_CUDA=OFF >"$B/configure.log" 2>&1 || { cat "$B/configure.log"; exit 1; }
ninja -C "$B/core" -j "$JOBS" dynamiq_tests >"$B/build.log" 2>&1 || { tail -60 "$B/build.log"; exit 1; }
file -b "$B/core/dynamiq_tests" | cut -d, -f1-2
# The three exhaustive-sweep tests (FloatBitsSweep.*: every 5th float pattern;
# every 16-bit rounding word) take minutes under emulation; the native runs cover
# their code, which is the same.
# Without the suites of scheduling, transport and failure handling (send windows, timelines,
# fault injection, round counts, reduce-scatter/all-gather schedules, auto's cost model):
# ISA-independent code, run natively and under ASan. They took 125 of the 266 s under QEMU
# (2-core AMD guest, 2026-11-26). The codecs, kernels, allocator, thread pool, and an
# all-reduce end to end in every mode and topology stay.
skip=(FloatBitsSweep DynamiqRounding.SixteenBitUniformsAreUnbiasedTo2PowMinus17 Faults SendWindow Timeline
      SendAhead AutoMode Rounds ReduceScatter AllGather NcclOrder Slices Hierarchical Failure RendezvousSends
      SchedulePhases Schedule InprocTransport BufferPool ExecutorGuard HeaderCorruption Header BitFlipImpact)
filter="-$(for s in "${skip[@]}"; do case $s in *.*) printf '%s:' "$s" ;; *) printf '%s.*:' "$s" ;; esac; done)"
filter=${filter%:}
if [ $# -gt 0 ]; then
  qemu-aarch64 -L /usr/aarch64-linux-gnu "$B/core/dynamiq_tests" "$@"
  exit
fi
# QEMU runs one thread: the tests go in $JOBS GoogleTest shards side by side (152 s in one
# process on the 2-core AMD guest, 2026-11-26); each shard's log is printed when all are done.
pids=()
for ((i = 0; i < JOBS; i++)); do
  GTEST_TOTAL_SHARDS=$JOBS GTEST_SHARD_INDEX=$i qemu-aarch64 -L /usr/aarch64-linux-gnu "$B/core/dynamiq_tests" \
    --gtest_brief=1 --gtest_filter="$filter" >"$B/tests.$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < JOBS; i++)); do
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "-- shard $((i + 1)) of $JOBS (exit $rc):"
  cat "$B/tests.$i.log"
  [ "$rc" -eq 0 ] || failed=1
done
[ "$failed" -eq 0 ] || { echo "[aarch64] FAILED: a shard failed (its log above)"; exit 1; }
