// csrc/kernels/base/philox.h against curand's Philox4x32-10 (curand_philox4x32_x.h's
// curand_Philox4x32_10, the function the CUDA kernels call), on the host: the CPU codecs and
// the GPU kernels draw the same words for the same (counter, key), so their messages can be
// bit-identical. curand's header is compiled here by the host compiler (its host branch of
// mulhilo32; the device branch is __umulhi, the same high word). Built only where CMake found
// curand's headers (scripts/test.sh requires them when nvcc is present).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#define QUALIFIERS static inline
#include <vector_types.h>
#include <curand_philox4x32_x.h>

#include "kernels/base/philox.h"

namespace dynamiq {
namespace {

uint4 curand_words(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  uint4 c;
  c.x = c0, c.y = c1, c.z = c2, c.w = c3;
  uint2 k;
  k.x = k0, k.y = k1;
  return curand_Philox4x32_10(c, k);
}

void expect_same(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  const Philox4x32 a = philox4x32_10(c0, c1, c2, c3, k0, k1);
  const uint4 b = curand_words(c0, c1, c2, c3, k0, k1);
  ASSERT_EQ(a.v[0], b.x);
  ASSERT_EQ(a.v[1], b.y);
  ASSERT_EQ(a.v[2], b.z);
  ASSERT_EQ(a.v[3], b.w);
}

TEST(PhiloxCurand, EqualsCurandsPhilox4x32_10) {
  // corners: all-zero and all-one counters and keys, carries in every word
  const uint32_t edge[] = {0u, 1u, 0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu};
  for (uint32_t a : edge)
    for (uint32_t b : edge)
      for (uint32_t k : edge) expect_same(a, b, ~a, ~b, k, ~k);
  // a million random (counter, key) pairs
  std::mt19937_64 g(20261126);
  for (int i = 0; i < 1000000; ++i) {
    const uint64_t x = g(), y = g(), z = g();
    expect_same(uint32_t(x), uint32_t(x >> 32), uint32_t(y), uint32_t(y >> 32), uint32_t(z), uint32_t(z >> 32));
  }
}

TEST(PhiloxCurand, TheCountersAndKeysTheCodecsUse) {
  // the counter layout of philox.h: (element or group index, purpose, rank, 0) under keys
  // derived from (seed, sequence, slice)
  for (uint64_t seq : {0ull, 1ull, 77ull, (1ull << 40) + 3}) {
    const RngKey key = make_rng_key(1234, seq, uint32_t(seq % 3));
    for (uint32_t idx = 0; idx < 4096; idx += 7)
      for (uint32_t purpose : {uint32_t(kPurposeValue), uint32_t(kPurposeGroupScale), uint32_t(kPurposePermutation)})
        for (uint32_t rank : {0u, 1u, 7u}) expect_same(idx, purpose, rank, 0, key.k0, key.k1);
  }
}

}  // namespace
}  // namespace dynamiq
