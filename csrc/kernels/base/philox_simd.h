// Philox4x32-10 (philox.h) for many consecutive counters at once, on AVX2
// registers; bit-identical to philox4x32_10 (tested:
// DynamiqKernels.Avx2PhiloxMatchesScalar).
//
// For counters (lo + k, c1, c2, hi), k < q (q a multiple of 32, lo + q without
// a 32-bit wrap), and key (k0, k1): w[4k + j] = word j of counter k's output
// (the four words of a call side by side: a call's 128 bits are one 16-byte
// load for the 8 elements it rounds, dynamiq's RNG layout).
//
// The function has internal linkage (static): each file that includes this
// header compiles its own copy with its own ISA flags, so a copy built with
// wider flags could never be linked into code that runs on an AVX2-only CPU.
// It is defined only where the file's flags enable AVX2. (An AVX-512 variant
// was withdrawn with DynamiQ's AVX-512 kernels, never having run: CHANGELOG.)
#pragma once

#include <cstdint>

#include "kernels/base/philox.h"
#include "kernels/base/x86_intrin.h"

namespace dynamiq {

#if defined(__AVX2__) && !defined(__CUDA_ARCH__)
// 8 lanes per register, 4 independent registers interleaved so the multiply
// latency is hidden (gcc's auto-vectorisation of the scalar loop runs 4x slower).
static inline void philox4x32_10_x32_avx2(uint32_t lo, uint32_t c1, uint32_t c2, uint32_t hi,
                                          uint32_t k0, uint32_t k1, int q, uint32_t* __restrict w) {
  using namespace philox_detail;
  constexpr int NB = 4;
  const __m256i M0 = _mm256_set1_epi64x(kM0), M1 = _mm256_set1_epi64x(kM1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int k8 = 0; k8 < q; k8 += 8 * NB) {
    __m256i a0[NB], a1[NB], a2[NB], a3[NB];
    for (int b = 0; b < NB; ++b) {
      a0[b] = _mm256_add_epi32(_mm256_set1_epi32(int(lo + uint32_t(k8 + 8 * b))), lane);
      a1[b] = _mm256_set1_epi32(int(c1));
      a2[b] = _mm256_set1_epi32(int(c2));
      a3[b] = _mm256_set1_epi32(int(hi));
    }
    uint32_t kk0 = k0, kk1 = k1;
    for (int r = 0; r < 10; ++r) {
      const __m256i K0 = _mm256_set1_epi32(int(kk0)), K1 = _mm256_set1_epi32(int(kk1));
      for (int b = 0; b < NB; ++b) {
        const __m256i pe0 = _mm256_mul_epu32(a0[b], M0);
        const __m256i po0 = _mm256_mul_epu32(_mm256_srli_epi64(a0[b], 32), M0);
        const __m256i pe1 = _mm256_mul_epu32(a2[b], M1);
        const __m256i po1 = _mm256_mul_epu32(_mm256_srli_epi64(a2[b], 32), M1);
        const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(pe0, 32), po0, 0xAA);
        const __m256i lo0 = _mm256_blend_epi32(pe0, _mm256_slli_epi64(po0, 32), 0xAA);
        const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(pe1, 32), po1, 0xAA);
        const __m256i lo1 = _mm256_blend_epi32(pe1, _mm256_slli_epi64(po1, 32), 0xAA);
        a0[b] = _mm256_xor_si256(_mm256_xor_si256(hi1, a1[b]), K0);
        a2[b] = _mm256_xor_si256(_mm256_xor_si256(hi0, a3[b]), K1);
        a1[b] = lo1;
        a3[b] = lo0;
      }
      kk0 += kW0;
      kk1 += kW1;
    }
    // 4 x 8 words to 8 calls of 4 words: a 4x4 transpose per 128-bit lane
    // (calls c and c + 4 of the register share a lane), then the lanes regrouped
    for (int b = 0; b < NB; ++b) {
      const __m256i t0 = _mm256_unpacklo_epi32(a0[b], a1[b]), t1 = _mm256_unpackhi_epi32(a0[b], a1[b]);
      const __m256i t2 = _mm256_unpacklo_epi32(a2[b], a3[b]), t3 = _mm256_unpackhi_epi32(a2[b], a3[b]);
      const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);  // calls 0|4, 1|5
      const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);  // calls 2|6, 3|7
      uint32_t* o = w + 4 * (k8 + 8 * b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_permute2x128_si256(u0, u1, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 8), _mm256_permute2x128_si256(u2, u3, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), _mm256_permute2x128_si256(u0, u1, 0x31));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 24), _mm256_permute2x128_si256(u2, u3, 0x31));
    }
  }
}
#endif

}  // namespace dynamiq
