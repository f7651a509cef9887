// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"),
// one implementation for host and device. Counter-based: the same (key,
// counter) always gives the same four words, so every rank and every kernel
// (CPU or CUDA) can draw the random number of an element without state.
//
// Key schedule for dynamiq (make_rng_key below): key = (user seed, collective sequence
// number) mixed with a stream id; counter = (element or group index, purpose,
// rank or 0 for shared randomness, 0).
#pragma once

#include "kernels/base/common.h"

// In CUDA code the words come from curand's own Philox4x32-10 (the build defines
// DYNAMIQ_CURAND_DEVICE where it found curand's headers); the host code below is the same
// function, which tests/cpp/curand/test_philox_curand.cc checks against curand's.
#if defined(DYNAMIQ_CURAND_DEVICE) && defined(__CUDACC__)
#include <curand_philox4x32_x.h>
#endif

namespace dynamiq {

struct Philox4x32 {
  uint32_t v[4];
};

namespace philox_detail {
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;

DQ_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}
}  // namespace philox_detail

DQ_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
#if defined(DYNAMIQ_CURAND_DEVICE) && defined(__CUDA_ARCH__)
  const uint4 w = curand_Philox4x32_10(make_uint4(c0, c1, c2, c3), make_uint2(k0, k1));
  return Philox4x32{{w.x, w.y, w.z, w.w}};
#else
  using namespace philox_detail;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c0, hi0, lo0);
    mulhilo(kM1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n1 = lo1;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    uint32_t n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
#endif
}

// A 32-bit word to a uniform float in [0, 1): the top 24 bits, exactly
// representable, so P(u < p) = ceil(p * 2^24) / 2^24 for p in [0, 1].
DQ_HD float u01(uint32_t w) { return float(w >> 8) * (1.0f / 16777216.0f); }

// Purposes: the third counter word separates independent draws for the same element.
enum RngPurpose : uint32_t {
  kPurposeValue = 1,       // stochastic rounding of an element (private)
  kPurposeGroupScale = 2,  // stochastic rounding of a group scale (private)
  kPurposePermutation = 3, // correlated rounding permutation (shared by all ranks)
  kPurposeExtra = 4,
};

// Key derivation: everything a draw depends on besides the counter.
struct RngKey {
  uint32_t k0, k1;
};

// `slice`: the k-th collective of a bucket split by max_collective_bytes (0 for
// every bucket that is not split, whose keys are unchanged by it).
DQ_HD RngKey make_rng_key(uint64_t seed, uint64_t sequence, uint32_t slice = 0) {
  // One Philox call as a mixing function, so nearby (seed, sequence, slice)
  // triples give unrelated keys.
  Philox4x32 r = philox4x32_10(uint32_t(sequence), uint32_t(sequence >> 32), 0x64796e61u /*"dyna"*/ + slice,
                               0x6d69715fu, uint32_t(seed), uint32_t(seed >> 32));
  return RngKey{r.v[0], r.v[1]};
}

}  // namespace dynamiq
