#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of received bytes (tests/fuzz/, libFuzzer with
# AddressSanitizer + UBSan, clang from Debian).
#   bash scripts/fuzz.sh [SECONDS]          # every target SECONDS (default 60), corpus kept in build/fuzz-work
#   bash scripts/fuzz.sh --ci [SECONDS]     # CI: fixed seed, only the generated seed corpus, SECONDS (default 8)
#   bash scripts/fuzz.sh --record SECONDS   # a campaign, written to experiments/results/fuzz/
#   FUZZ_TARGETS="fuzz_plan fuzz_collective" bash scripts/fuzz.sh 30   # some targets only
#   FUZZ_JOBS=2 ...                          # targets run this many at a time (default 1)
#   FUZZ_CPU_SECONDS=180 bash scripts/fuzz.sh 1800   # each target until it has used 180 s of CPU
#                                            # (or 1800 s of wall time): fair figures on a shared machine
#   FUZZ_CPU_ARCH= ...                       # the portable kernels (no intrinsics; build/fuzz-generic)
#                                            # instead of the x86-64-v3 (AVX2) build
# Fails (exit 1) on a finding: the input is kept as build/fuzz-artifacts/<target>-crash-*,
# and the line to reproduce it is printed. Installs clang-19, libclang-rt-19-dev and llvm-19
# (the symbolizer) if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=dev
RECORD=0
case "${1:-}" in
  --ci) MODE=ci; shift ;;
  --record) RECORD=1; shift ;;
esac
SECS=${1:-$([ "$MODE" = ci ] && echo 8 || echo 60)}
JOBS=${JOBS:-2}
FUZZ_JOBS=${FUZZ_JOBS:-1}
CLANG=${CLANG:-clang++-19}
log() { printf '[fuzz] %s\n' "$*"; }

apt_pkgs=()
command -v "$CLANG" >/dev/null 2>&1 || apt_pkgs+=(clang-19)
ls /usr/lib/llvm-19/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || apt_pkgs+=(libclang-rt-19-dev)
[ -x /usr/lib/llvm-19/bin/llvm-symbolizer ] || apt_pkgs+=(llvm-19)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${apt_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}" >/tmp/dynamiq-apt-fuzz.log 2>&1; then
    $SUDO apt-get update >>/tmp/dynamiq-apt-fuzz.log 2>&1
    $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}" >>/tmp/dynamiq-apt-fuzz.log 2>&1 \
      || { cat /tmp/dynamiq-apt-fuzz.log; exit 1; }
  fi
fi
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer
# leaks are findings too; a UBSan report stops the run (-fno-sanitize-recover)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# -O1 -g1 as the ASan stage of scripts/test.sh; ccache when present.
B=build/fuzz
ARCH_ARGS=()
if [ "${FUZZ_CPU_ARCH+set}" = set ]; then
  B=build/fuzz-${FUZZ_CPU_ARCH:-generic}
  ARCH_ARGS=(-DDYNAMIQ_CPU_ARCH="$FUZZ_CPU_ARCH")
fi
command -v ccache >/dev/null 2>&1 && export CMAKE_CXX_COMPILER_LAUNCHER=ccache
t0=$SECONDS
cmake -S . -B $B -G Ninja -DCMAKE_CXX_COMPILER="$CLANG" -DDYNAMIQ_BUILD_PYTHON=OFF -DDYNAMIQ_CUDA=OFF \
  -DDYNAMIQ_BUILD_FUZZERS=ON -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" "${ARCH_ARGS[@]}" >$B-configure.log 2>&1 \
  || { cat $B-configure.log; exit 1; }
ALL=$(cd tests/fuzz && ls fuzz_*.cc | sed 's/\.cc$//' | tr '\n' ' ')
TARGETS=${FUZZ_TARGETS:-$ALL}
ninja -C $B -j "$JOBS" fuzz_corpus $TARGETS >$B-build.log 2>&1 || { tail -60 $B-build.log; exit 1; }
log "built in $((SECONDS - t0)) s: $TARGETS"

# The seed corpus, written afresh from real messages (tests/fuzz/corpus/make_corpus.cc).
rm -rf $B-seeds
$B/tests/fuzz/fuzz_corpus $B-seeds >/dev/null
mkdir -p $B-artifacts $B-logs

run_target() {
  local t=$1 work
  if [ "$MODE" = ci ]; then
    # deterministic in its corpus: the generated seeds only, nothing kept from earlier runs
    work=$B-ci/$t
    rm -rf "$work"
    mkdir -p "$work"
    extra=(-seed=1)
  else
    work=$B-work/$t
    mkdir -p "$work"
    extra=()
  fi
  # -timeout: one input longer than FUZZ_UNIT_TIMEOUT s (default 10; 60 with a CPU budget) is
  # a hang (a finding); it is wall-clock, and a target at nice 19 beside busy processes can take
  # 10 s for an input of 0.25 s of CPU (fuzz_plan, twice). 2.5 GB: a growing memory use is one
  # too. -use_value_profile: comparisons guide the search (header fields, counts).
  /usr/bin/time -f "%U %S %e" -o $B-logs/$t.time nice -n 19 $B/tests/fuzz/$t "$work" $B-seeds/$t -max_total_time="$SECS" \
    -timeout="${FUZZ_UNIT_TIMEOUT:-$([ -n "${FUZZ_CPU_SECONDS:-}" ] && echo 60 || echo 10)}" \
    -rss_limit_mb=2560 -use_value_profile=1 -print_final_stats=1 -artifact_prefix="$B-artifacts/$t-" \
    "${extra[@]}" >$B-logs/$t.log 2>&1 &
  local tp=$! fp="" rc=0
  if [ -n "${FUZZ_CPU_SECONDS:-}" ]; then
    # libFuzzer stops at a wall-time limit only; with a CPU budget, SIGINT once the fuzzer's
    # own CPU time (utime + stime in /proc/<pid>/stat) reaches it (libFuzzer then prints its
    # final stats and exits 72)
    local hz
    hz=$(getconf CLK_TCK)
    while kill -0 "$tp" 2>/dev/null; do
      [ -z "$fp" ] && fp=$(pgrep -f "^$B/tests/fuzz/$t $work" | head -1 || true)
      if [ -n "$fp" ] && [ -r /proc/$fp/stat ]; then
        local ticks
        ticks=$(awk '{print $14 + $15}' /proc/$fp/stat 2>/dev/null || echo 0)
        if [ "$ticks" -ge $((FUZZ_CPU_SECONDS * hz)) ]; then
          kill -INT "$fp" 2>/dev/null || true
          break
        fi
      fi
      sleep 2
    done
  fi
  wait "$tp" || rc=$?
  [ "$rc" -eq 72 ] && rc=0  # interrupted at the CPU budget
  return "$rc"
}

rc_all=0
failed=()
running=0
pids=()
names=()
for t in $TARGETS; do
  run_target "$t" &
  pids+=($!)
  names+=("$t")
  running=$((running + 1))
  if [ "$running" -ge "$FUZZ_JOBS" ]; then
    wait "${pids[0]}" || { rc_all=1; failed+=("${names[0]}"); }
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
    running=$((running - 1))
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { rc_all=1; failed+=("${names[$i]}"); }
done

# One line per target from libFuzzer's final stats (and $B-logs/summary.json).
python3 - "$SECS" "$MODE" "$B" $TARGETS <<'EOF'
import json, os, re, sys
secs, mode, b, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = []
print(f"{'target':22} {'execs':>10} {'exec/s':>7} {'cpu s':>6} {'cov':>6} {'of':>6} {'ft':>7} {'corpus':>7} {'rss MB':>7}  result")
for t in targets:
    text = open(f"{b}-logs/{t}.log", errors="replace").read()
    last = [l for l in text.splitlines() if re.match(r"#\d+\s", l)]
    m = re.search(r"cov: (\d+) ft: (\d+) corp: (\d+)/", last[-1]) if last else None
    pcs = re.search(r"Loaded 1 modules\s+\((\d+) inline 8-bit counters\)", text)
    st = {k: int(v) for k, v in re.findall(r"stat::(\w+):\s+(\d+)", text)}
    try:
        user, sys_, wall = (float(x) for x in open(f"{b}-logs/{t}.time").read().split()[-3:])
    except (OSError, ValueError):
        user = sys_ = wall = float("nan")
    ok = ("Done " in text or "run interrupted" in text) and "ERROR" not in text and "FUZZ FINDING" not in text
    row = dict(target=t, execs=st.get("number_of_executed_units"), exec_per_s=st.get("average_exec_per_sec"),
               cpu_s=round(user + sys_, 1), wall_s=round(wall, 1), cov=int(m.group(1)) if m else None,
               counters=int(pcs.group(1)) if pcs else None, ft=int(m.group(2)) if m else None,
               corpus=int(m.group(3)) if m else None, peak_rss_mb=st.get("peak_rss_mb"),
               result="ok" if ok else "FINDING")
    rows.append(row)
    print(f"{t:22} {row['execs'] or '?':>10} {row['exec_per_s'] or '?':>7} {row['cpu_s']:>6} {row['cov'] or '?':>6} "
          f"{row['counters'] or '?':>6} {row['ft'] or '?':>7} {row['corpus'] or '?':>7} {row['peak_rss_mb'] or '?':>7}  {row['result']}")
json.dump(dict(seconds_per_target=int(secs), cpu_seconds_per_target=int(os.environ.get("FUZZ_CPU_SECONDS") or 0) or None,
               mode=mode, build=b, targets=rows), open(f"{b}-logs/summary.json", "w"), indent=1)
EOF

if [ "$rc_all" -ne 0 ]; then
  for t in "${failed[@]}"; do
    echo "== FINDING in $t ($B-logs/$t.log):"
    grep -E "FUZZ FINDING|ERROR|runtime error|SUMMARY|^    #[0-9] " "$B-logs/$t.log" | head -30
    for a in $B-artifacts/$t-*; do
      [ -e "$a" ] && echo "   reproduce: $B/tests/fuzz/$t $a"
    done
  done
  exit 1
fi
if [ "$RECORD" -eq 1 ]; then
  python3 tests/fuzz/record.py --summary "$B-logs/summary.json"
fi
log "no finding ($((SECONDS - t0)) s in all)"
