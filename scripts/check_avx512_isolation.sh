#!/usr/bin/env bash
# The AVX-512 kernel files (csrc/kernels/*/*_avx512.cc, the only ones compiled
# with -mavx512*) must define no symbol that another file could bind to except
# their entry points in a namespace `...::avx512`: an inline function or
# template from a shared header compiled there is a weak symbol the linker may
# pick for the whole library, which must still run on AVX2-only CPUs.
#   bash scripts/check_avx512_isolation.sh [build dir, default build/cpp]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/cpp}
# No AVX-512 kernel file in the tree (none since DynamiQ's were withdrawn,
# CHANGELOG): nothing is compiled with -mavx512*, so nothing can leak. With a
# source present, its object must be there (the build made it).
shopt -s nullglob
srcs=(csrc/kernels/*/*_avx512.cc)
if [ ${#srcs[@]} -eq 0 ]; then
  echo "avx512 isolation: no AVX-512 kernel sources (csrc/kernels/*/*_avx512.cc): nothing compiled with -mavx512*"
  exit 0
fi
mapfile -t objs < <(find "$B" -name '*_avx512.cc.o' | sort)
[ ${#objs[@]} -eq ${#srcs[@]} ] || { echo "avx512 isolation: ${#srcs[@]} *_avx512.cc source(s), ${#objs[@]} object(s) under $B (build first)"; exit 1; }
bad=0
for o in "${objs[@]}"; do
  # global (upper-case type) definitions, weak ones included, outside ::avx512::
  leaks=$(nm -C --defined-only "$o" | awk '$2 ~ /^[A-Z]$/' | grep -v '::avx512::' || true)
  if [ -n "$leaks" ]; then
    echo "avx512 isolation: $o defines symbols outside ::avx512:: --"
    echo "$leaks"
    bad=1
  fi
done
[ "$bad" -eq 0 ] && echo "avx512 isolation: ${#objs[@]} object(s), only ::avx512:: entry points exported"
exit "$bad"
