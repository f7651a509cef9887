// The AVX2 kernel of the DynamiQ CPU codec that the dispatcher
// (dynamiq_codec.cc) inlines: the decode value loop is so short (about 90 ns
// per 256-value super-group) that a call into dynamiq_cpu_avx2.cc per
// super-group shows in decompress (bench_kernels 16777216 0.4 float32/4/ on
// the Zen 3 guest: memcpy ratio 1.33 with the call, 1.46 inlined; medians of
// 3 rounds).
// Static, as dynamiq_cpu.h's helpers; only in the AVX2 build.
#pragma once

#include "kernels/dynamiq/dynamiq_cpu.h"

#if defined(__AVX2__)

#include <cstring>

namespace dynamiq::dq_cpu::avx2 {

// The value loop of scalar::decode_values for B in {2, 4, 8} and nb = S*B/8 a
// multiple of 8: tile = fma(decode[code], scale, base) (base != nullptr) or
// decode[code] * scale, scale = gv[i >> rs] for the 8 elements from i (per_run:
// s a multiple of 8).
template <int B>
static inline void decode_values(const float* __restrict dec, const uint8_t* __restrict codes, int S,
                                 const float* __restrict gv, int rs, const float* __restrict base,
                                 float* __restrict tile) {
  constexpr int P = 8 / B;
  const int nb = S / P;
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
  if constexpr (B == 2) {
    t0 = _mm256_setr_ps(dec[0], dec[1], dec[2], dec[3], 0.0f, 0.0f, 0.0f, 0.0f);
  } else if constexpr (B == 4) {
    t0 = _mm256_loadu_ps(dec);
    t1 = _mm256_loadu_ps(dec + 8);
  }
  for (int k = 0; k < nb; k += 8) {
    const __m256i bytes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k)));
    for (int j = 0; j < P; ++j) {
      const int i = k + j * nb;
      const __m256i c = _mm256_and_si256(_mm256_srli_epi32(bytes, j * B), mask);
      __m256 d;
      if constexpr (B == 2) {
        d = _mm256_permutevar8x32_ps(t0, c);
      } else if constexpr (B == 4) {
        d = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, c), _mm256_permutevar8x32_ps(t1, c),
                             _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
      } else {
        // 8 scalar loads (an 8-wide gather was slower on the Zen 3 guest)
        uint64_t cb;
        std::memcpy(&cb, codes + k, 8);
        __m128 lo = _mm_load_ss(dec + (cb & 0xff));
        __m128 hi = _mm_load_ss(dec + ((cb >> 32) & 0xff));
        lo = _mm_insert_ps(lo, _mm_load_ss(dec + ((cb >> 8) & 0xff)), 0x10);
        hi = _mm_insert_ps(hi, _mm_load_ss(dec + ((cb >> 40) & 0xff)), 0x10);
        lo = _mm_insert_ps(lo, _mm_load_ss(dec + ((cb >> 16) & 0xff)), 0x20);
        hi = _mm_insert_ps(hi, _mm_load_ss(dec + ((cb >> 48) & 0xff)), 0x20);
        lo = _mm_insert_ps(lo, _mm_load_ss(dec + ((cb >> 24) & 0xff)), 0x30);
        hi = _mm_insert_ps(hi, _mm_load_ss(dec + (cb >> 56)), 0x30);
        d = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
      }
      const __m256 s8 = _mm256_broadcast_ss(gv + (i >> rs));
      if (base)
        _mm256_storeu_ps(tile + i, _mm256_fmadd_ps(d, s8, _mm256_loadu_ps(base + i)));
      else
        _mm256_storeu_ps(tile + i, _mm256_mul_ps(d, s8));
    }
  }
}

}  // namespace dynamiq::dq_cpu::avx2

#endif  // __AVX2__
