// The DynamiQ CPU codec: the CPU kernels (ISA switch: kernels/base/cpu_isa.h).
// Tables: dynamiq_tables.cc; plan helpers: dynamiq_plan.cc.
#include "kernels/dynamiq/dynamiq_codec.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/base/parallel.h"
#include "kernels/base/unit_io.h"

#include "kernels/base/cpu_isa.h"
#include "kernels/base/x86_intrin.h"

// AVX-512 kernels (F, BW, DQ, VL) next to the AVX2 ones, chosen at run time
// (cpu_isa()): compiled with a target attribute, so the library still runs on
// AVX2-only machines. Every AVX-512 path is bit-identical to its AVX2 twin and
// to the shared math (tests/cpp/test_dynamiq_fastpath.cc runs under both ISAs).
#if defined(DQ_HAVE_AVX512)
#define DQ_AVX512_FN __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#endif

namespace dynamiq {

// ============================================================ CPU kernels ====

namespace {

inline bool cpu_avx512() { return cpu_isa() == CpuIsa::kAvx512; }

// Per-call scratch: one super-group's worth of everything (stays in L1/L2).
struct Work {
  std::vector<float> tile, gmax, scale_e, inv_e, pi, ginv, grun;
  std::vector<uint32_t> gr;
  std::vector<uint32_t> words, swords;
  std::vector<uint8_t> codes;
  std::vector<uint32_t> codes32;
  std::vector<float> a, p;
  std::vector<int32_t> j;
  const uint8_t* col8 = nullptr;  // byte column of the permutation table (3 <= n <= 8)
  explicit Work(int S, int G)
      : tile(size_t(S)), gmax(size_t(G)), scale_e(size_t(S)), inv_e(size_t(S)), pi(size_t(S)),
        ginv(size_t(G)), grun(size_t(S / 8 + 1)), gr(size_t(G)), words(size_t(S)),
        swords(size_t(S)), codes(size_t(2 * S)), codes32(size_t(S)), a(size_t(S)), p(size_t(S)),
        j(size_t(S)) {}
};

#if defined(__AVX2__)
// Philox4x32-10 for 32 consecutive counters at once: 8 lanes per AVX2 register,
// 4 independent registers interleaved so the multiply latency is hidden
// (gcc's auto-vectorisation of the scalar loop runs 4x slower). Bit-identical
// to philox4x32_10 (tested: DynamiqKernels.Avx2PhiloxMatchesScalar).
inline void philox_x32_avx2(uint32_t lo, uint32_t c1, uint32_t c2, uint32_t hi, uint32_t k0,
                            uint32_t k1, int q, uint32_t* __restrict w) {
  constexpr int NB = 4;
  const __m256i M0 = _mm256_set1_epi64x(0xD2511F53u), M1 = _mm256_set1_epi64x(0xCD9E8D57u);
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
      kk0 += 0x9E3779B9u;
      kk1 += 0xBB67AE85u;
    }
    for (int b = 0; b < NB; ++b) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + k8 + 8 * b), a0[b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + k8 + 8 * b + q), a1[b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + k8 + 8 * b + 2 * q), a2[b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + k8 + 8 * b + 3 * q), a3[b]);
    }
  }
}
#endif

#if defined(DQ_HAVE_AVX512)
// The same 32 counters per iteration on 16 lanes x 2 interleaved registers:
// the 64-bit products' halves are regrouped with one vpermt2d each and the
// two XORs of a round are one vpternlogd. Bit-identical to philox4x32_10
// (tested against the scalar code and the AVX2 path).
DQ_AVX512_FN void philox_x32_avx512(uint32_t lo, uint32_t c1, uint32_t c2, uint32_t hi, uint32_t k0,
                                    uint32_t k1, int q, uint32_t* __restrict w) {
  constexpr int NB = 2;
  const __m512i M0 = _mm512_set1_epi64(0xD2511F53u), M1 = _mm512_set1_epi64(0xCD9E8D57u);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // dword k of (even products, odd products): hi halves and lo halves back in lane order
  const __m512i take_hi = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  const __m512i take_lo = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
  for (int k16 = 0; k16 < q; k16 += 16 * NB) {
    __m512i a0[NB], a1[NB], a2[NB], a3[NB];
    for (int b = 0; b < NB; ++b) {
      a0[b] = _mm512_add_epi32(_mm512_set1_epi32(int(lo + uint32_t(k16 + 16 * b))), lane);
      a1[b] = _mm512_set1_epi32(int(c1));
      a2[b] = _mm512_set1_epi32(int(c2));
      a3[b] = _mm512_set1_epi32(int(hi));
    }
    uint32_t kk0 = k0, kk1 = k1;
    for (int r = 0; r < 10; ++r) {
      const __m512i K0 = _mm512_set1_epi32(int(kk0)), K1 = _mm512_set1_epi32(int(kk1));
      for (int b = 0; b < NB; ++b) {
        const __m512i pe0 = _mm512_mul_epu32(a0[b], M0);
        const __m512i po0 = _mm512_mul_epu32(_mm512_srli_epi64(a0[b], 32), M0);
        const __m512i pe1 = _mm512_mul_epu32(a2[b], M1);
        const __m512i po1 = _mm512_mul_epu32(_mm512_srli_epi64(a2[b], 32), M1);
        const __m512i hi0 = _mm512_permutex2var_epi32(pe0, take_hi, po0);
        const __m512i lo0 = _mm512_permutex2var_epi32(pe0, take_lo, po0);
        const __m512i hi1 = _mm512_permutex2var_epi32(pe1, take_hi, po1);
        const __m512i lo1 = _mm512_permutex2var_epi32(pe1, take_lo, po1);
        a0[b] = _mm512_ternarylogic_epi32(hi1, a1[b], K0, 0x96);  // hi1 ^ c1 ^ k0
        a2[b] = _mm512_ternarylogic_epi32(hi0, a3[b], K1, 0x96);  // hi0 ^ c3 ^ k1
        a1[b] = lo1;
        a3[b] = lo0;
      }
      kk0 += 0x9E3779B9u;
      kk1 += 0xBB67AE85u;
    }
    for (int b = 0; b < NB; ++b) {
      _mm512_storeu_si512(w + k16 + 16 * b, a0[b]);
      _mm512_storeu_si512(w + k16 + 16 * b + q, a1[b]);
      _mm512_storeu_si512(w + k16 + 16 * b + 2 * q, a2[b]);
      _mm512_storeu_si512(w + k16 + 16 * b + 3 * q, a3[b]);
    }
  }
}
#endif

// words[k + j*(S/4)] = word j of call base + k, k < S/4.
inline void fill_words(const RngKey& key, uint64_t base, uint32_t purpose, uint32_t who, int S,
                       uint32_t* __restrict words) {
  const int q = S / 4;
  const uint32_t hi = uint32_t(base >> 32);
  const uint32_t lo = uint32_t(base);
  const bool no_wrap = uint64_t(lo) + uint64_t(q) <= (uint64_t(1) << 32);
#if defined(DQ_HAVE_AVX512)
  if (no_wrap && q % 32 == 0 && cpu_avx512()) {
    philox_x32_avx512(lo, purpose, who, hi, key.k0, key.k1, q, words);
    return;
  }
#endif
#if defined(__AVX2__)
  if (no_wrap && q % 32 == 0) {
    philox_x32_avx2(lo, purpose, who, hi, key.k0, key.k1, q, words);
    return;
  }
#endif
  for (int k = 0; k < q; ++k) {
    const Philox4x32 r = no_wrap ? philox4x32_10(lo + uint32_t(k), purpose, who, hi, key.k0, key.k1)
                                 : dq_draw(key, base + uint64_t(k), purpose, who);
    words[k] = r.v[0];
    words[k + q] = r.v[1];
    words[k + 2 * q] = r.v[2];
    words[k + 3 * q] = r.v[3];
  }
}

// w[0, S/2) holds 32-bit words; afterwards w[k] = dq_u16_word(low half of
// word k) and w[k + S/2] = dq_u16_word(high half of word k), k < S/2.
inline void expand_u16_words(int S, uint32_t* __restrict w) {
  const int h = S / 2;
  int k = 0;
#if defined(__AVX2__)
  const __m256i mid = _mm256_set1_epi32(0x8000), himask = _mm256_set1_epi32(int(0xffff0000u));
  for (; k + 8 <= h; k += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + k + h),
                        _mm256_or_si256(_mm256_and_si256(v, himask), mid));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + k), _mm256_or_si256(_mm256_slli_epi32(v, 16), mid));
  }
#endif
  for (; k < h; ++k) {
    const uint32_t v = w[k];
    w[k + h] = dq_u16_word(v >> 16);
    w[k] = dq_u16_word(v & 0xffffu);
  }
}

inline void put_bf16(uint8_t* p, uint16_t h) {
  p[0] = uint8_t(h);
  p[1] = uint8_t(h >> 8);
}

struct Ctx {
  const DynamiqFormat& f;
  const DqTables& tb;
  bool stochastic_scales;
  const DynamiqTables& tables;
};

#if defined(__AVX2__)
// ---- AVX2 building blocks (bit-identical to the scalar functions they mirror) ----

// high 32 bits of a * b per 32-bit lane (perm_mulhi, philox mulhilo)
inline __m256i mulhi_epu32(__m256i a, __m256i b) {
  const __m256i pe = _mm256_mul_epu32(a, b);
  const __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
  return _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
}

// (f(0), ..., f(7)) from 8 scalar loads and inserts: on the Zen 3 guest
// cheaper than an 8-wide gather (vpgatherdd)
template <typename F>
inline __m256i insert8_epi32(F&& f) {
  __m128i a = _mm_cvtsi32_si128(f(0)), b = _mm_cvtsi32_si128(f(4));
  a = _mm_insert_epi32(a, f(1), 1);
  b = _mm_insert_epi32(b, f(5), 1);
  a = _mm_insert_epi32(a, f(2), 2);
  b = _mm_insert_epi32(b, f(6), 2);
  a = _mm_insert_epi32(a, f(3), 3);
  b = _mm_insert_epi32(b, f(7), 3);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

// Eight 16-byte records base + 4 idx[k], k < 8, transposed: out[f] lane k =
// field f of record k. 8 plain loads and a 4x4 transpose per 128-bit lane
// (on the Zen 3 guest cheaper than gathering the fields).
inline void load_records8(const float* base, const int32_t* idx, __m256 out[4]) {
  auto rows = [&](int k) {
    const __m128 lo = _mm_loadu_ps(base + 4 * idx[k]);
    const __m128 hi = _mm_loadu_ps(base + 4 * idx[k + 4]);
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
  };
  const __m256 r0 = rows(0), r1 = rows(1), r2 = rows(2), r3 = rows(3);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  out[0] = _mm256_shuffle_ps(t0, t2, 0x44);
  out[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
  out[2] = _mm256_shuffle_ps(t1, t3, 0x44);
  out[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}

// perm_mix32 after its first step (x ^= x >> 16), on 8 lanes
inline __m256i mix32_tail_avx2(__m256i x) {
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x7feb352du)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x846ca68bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return x;
}

// perm_mix32 on 8 lanes
inline __m256i mix32_avx2(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x7feb352du)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x846ca68bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return x;
}

// perm_swap_or_not_t<kSmall>(n, rank, w) for NV x 8 words w (NV independent
// chains interleaved: the round's multiplies have a long latency)
template <bool kSmall, int NV>
inline void swap_or_not_avx2(uint32_t n, uint32_t rank, const __m256i* w, __m256i* xo) {
  const __m256i N = _mm256_set1_epi32(int(n));
  __m256i x[NV];
  for (int v = 0; v < NV; ++v) x[v] = _mm256_set1_epi32(int(rank));
  // h = perm_mix32(w ^ c_j): the mix's first step is linear over xor,
  // (w ^ c) ^ ((w ^ c) >> 16) = (w ^ (w >> 16)) ^ (c ^ (c >> 16)), so the
  // word's part is computed once for all rounds
  __m256i u[NV];
  for (int v = 0; v < NV; ++v) u[v] = _mm256_xor_si256(w[v], _mm256_srli_epi32(w[v], 16));
  for (uint32_t j = 0; j < uint32_t(kSwapOrNotRounds); ++j) {
    const uint32_t c = 0x9e3779b9u * (j + 1u);
    const __m256i cj = _mm256_set1_epi32(int(c ^ (c >> 16)));
    for (int v = 0; v < NV; ++v) {
      const __m256i h = mix32_tail_avx2(_mm256_xor_si256(u[v], cj));
      const __m256i k = mulhi_epu32(h, N);
      // k, x < n <= 2^16: signed compares are exact
      const __m256i wrap = _mm256_and_si256(_mm256_cmpgt_epi32(x[v], k), N);  // k < x: + n
      const __m256i xp = _mm256_sub_epi32(_mm256_add_epi32(k, wrap), x[v]);
      const __m256i hi = _mm256_max_epi32(x[v], xp);
      // the round function's bit in the sign position of `bit`
      __m256i bit;
      if constexpr (kSmall) {
        // bit (hi & 31) of g: shifted left by 31 - (hi & 31) = ~hi & 31
        const __m256i g = _mm256_mullo_epi32(h, _mm256_set1_epi32(int(0x2545f491u)));
        bit = _mm256_sllv_epi32(g, _mm256_andnot_si256(hi, _mm256_set1_epi32(31)));
      } else {
        bit = mix32_avx2(
            _mm256_add_epi32(h, _mm256_mullo_epi32(_mm256_set1_epi32(int(0x85ebca6bu)), hi)));
      }
      x[v] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(x[v]), _mm256_castsi256_ps(xp),
                                                  _mm256_castsi256_ps(bit)));  // xp where bit
    }
  }
  for (int v = 0; v < NV; ++v) xo[v] = x[v];
}

#if defined(DQ_HAVE_AVX512)
DQ_AVX512_FN inline __m512i mulhi_epu32_avx512(__m512i a, __m512i b) {
  const __m512i pe = _mm512_mul_epu32(a, b);
  const __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(b, 32));
  return _mm512_mask_mov_epi32(_mm512_srli_epi64(pe, 32), __mmask16(0xAAAA), po);
}

DQ_AVX512_FN inline __m512i mix32_tail_avx512(__m512i x) {
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x7feb352du)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x846ca68bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  return x;
}

// swap_or_not_avx2 on 16 lanes (the swap decision as a mask register)
template <bool kSmall, int NV>
DQ_AVX512_FN inline void swap_or_not_avx512(uint32_t n, uint32_t rank, const __m512i* w, __m512i* xo) {
  const __m512i N = _mm512_set1_epi32(int(n));
  __m512i x[NV], u[NV];
  for (int v = 0; v < NV; ++v) {
    x[v] = _mm512_set1_epi32(int(rank));
    u[v] = _mm512_xor_si512(w[v], _mm512_srli_epi32(w[v], 16));
  }
  for (uint32_t j = 0; j < uint32_t(kSwapOrNotRounds); ++j) {
    const uint32_t c = 0x9e3779b9u * (j + 1u);
    const __m512i cj = _mm512_set1_epi32(int(c ^ (c >> 16)));
    for (int v = 0; v < NV; ++v) {
      const __m512i h = mix32_tail_avx512(_mm512_xor_si512(u[v], cj));
      const __m512i k = mulhi_epu32_avx512(h, N);
      const __m512i xp = _mm512_sub_epi32(_mm512_mask_add_epi32(k, _mm512_cmpgt_epi32_mask(x[v], k), k, N), x[v]);
      const __m512i hi = _mm512_max_epi32(x[v], xp);
      __mmask16 bit;
      if constexpr (kSmall) {
        const __m512i g = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x2545f491u)));
        bit = _mm512_movepi32_mask(_mm512_sllv_epi32(g, _mm512_andnot_si512(hi, _mm512_set1_epi32(31))));
      } else {
        __m512i m = _mm512_add_epi32(h, _mm512_mullo_epi32(_mm512_set1_epi32(int(0x85ebca6bu)), hi));
        m = _mm512_xor_si512(m, _mm512_srli_epi32(m, 16));
        bit = _mm512_movepi32_mask(mix32_tail_avx512(m));
      }
      x[v] = _mm512_mask_mov_epi32(x[v], bit, xp);
    }
  }
  for (int v = 0; v < NV; ++v) xo[v] = x[v];
}

// fill_strata_avx2 on 16 lanes (S a multiple of 16)
DQ_AVX512_FN void fill_strata_avx512(const PermParams& pp, const uint8_t* col8, int S,
                                     const uint32_t* __restrict sw, float* __restrict pi) {
  if (pp.n == 2) {
    const __m512i r = _mm512_set1_epi32(int(pp.rank));
    for (int i = 0; i < S; i += 16)
      _mm512_storeu_ps(pi + i, _mm512_cvtepi32_ps(_mm512_xor_si512(r, _mm512_srli_epi32(_mm512_loadu_si512(sw + i), 31))));
  } else if (pp.n <= 4u) {
    // n! <= 24 entries: the column as dwords in two registers, looked up
    // with vpermt2d instead of a gather (masked loads: the column has n! bytes)
    const uint32_t nfact = pp.nfact;
    const __m512i nf = _mm512_set1_epi32(int(nfact));
    const __mmask16 m0 = nfact >= 16 ? __mmask16(0xffff) : __mmask16((1u << nfact) - 1u);
    const __mmask16 m1 = nfact > 16 ? __mmask16((1u << (nfact - 16)) - 1u) : __mmask16(0);
    const __m512i t0 = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m0, col8));
    const __m512i t1 = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m1, col8 + 16));
    for (int i = 0; i < S; i += 16) {
      const __m512i m = mulhi_epu32_avx512(_mm512_loadu_si512(sw + i), nf);  // < n!
      _mm512_storeu_ps(pi + i, _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(t0, m, t1)));
    }
  } else if (pp.n <= uint32_t(kPermTableMaxN)) {
    const __m512i nf = _mm512_set1_epi32(int(pp.nfact));
    const __m512i lo = _mm512_set1_epi32(0xff);
    for (int i = 0; i < S; i += 16) {
      const __m512i m = mulhi_epu32_avx512(_mm512_loadu_si512(sw + i), nf);
      const __m512i v = _mm512_and_si512(_mm512_i32gather_epi32(m, col8, 1), lo);
      _mm512_storeu_ps(pi + i, _mm512_cvtepi32_ps(v));
    }
  } else {
    constexpr int NV = 4;
    int i = 0;
    for (; i + 16 * NV <= S; i += 16 * NV) {
      __m512i w[NV], x[NV];
      for (int v = 0; v < NV; ++v) w[v] = _mm512_loadu_si512(sw + i + 16 * v);
      if (pp.n <= 32u)
        swap_or_not_avx512<true, NV>(pp.n, pp.rank, w, x);
      else
        swap_or_not_avx512<false, NV>(pp.n, pp.rank, w, x);
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(pi + i + 16 * v, _mm512_cvtepi32_ps(x[v]));
    }
    for (; i < S; i += 16) {
      __m512i w[1], x[1];
      w[0] = _mm512_loadu_si512(sw + i);
      if (pp.n <= 32u)
        swap_or_not_avx512<true, 1>(pp.n, pp.rank, w, x);
      else
        swap_or_not_avx512<false, 1>(pp.n, pp.rank, w, x);
      _mm512_storeu_ps(pi + i, _mm512_cvtepi32_ps(x[0]));
    }
  }
}
#endif

void fill_strata_avx2(const PermParams& pp, const uint8_t* col8, int S,
                      const uint32_t* __restrict sw, float* __restrict pi) {
  if (pp.n == 2) {
    const __m256i r = _mm256_set1_epi32(int(pp.rank));
    for (int i = 0; i < S; i += 8) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + i));
      _mm256_storeu_ps(pi + i, _mm256_cvtepi32_ps(_mm256_xor_si256(r, _mm256_srli_epi32(w, 31))));
    }
  } else if (pp.n <= 4u) {
    // n! <= 24 entries of the byte column (perm_table_column8) in two 16-byte
    // shuffle tables (entries 0-15, 16-31) repeated in both 128-bit lanes;
    // m < 32 sits in each lane's low byte (the other bytes are 0 and pick
    // entry 0, masked off), bit 4 of m picks the table
    alignas(16) uint8_t t[32] = {0};
    for (uint32_t k = 0; k < pp.nfact; ++k) t[k] = col8[k];
    const __m256i t0 = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
    const __m256i t1 = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t + 16)));
    const __m256i nf = _mm256_set1_epi32(int(pp.nfact));
    const __m256i lo = _mm256_set1_epi32(0xff);
    for (int i = 0; i < S; i += 8) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + i));
      const __m256i m = mulhi_epu32(w, nf);  // < n! <= 24
      const __m256i hi = _mm256_slli_epi32(m, 3);  // bit 4 -> bit 7 of the low byte
      const __m256i v = _mm256_blendv_epi8(_mm256_shuffle_epi8(t0, m), _mm256_shuffle_epi8(t1, m), hi);
      _mm256_storeu_ps(pi + i, _mm256_cvtepi32_ps(_mm256_and_si256(v, lo)));
    }
  } else if (pp.n <= uint32_t(kPermTableMaxN)) {
    // byte column (perm_table_column8), n! <= 40320 entries: 8 byte loads per
    // vector (an 8-wide gather was slower on the Zen 3 guest)
    const __m256i nf = _mm256_set1_epi32(int(pp.nfact));
    for (int i = 0; i < S; i += 8) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + i));
      alignas(32) uint32_t m[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(m), mulhi_epu32(w, nf));
      _mm256_storeu_ps(pi + i, _mm256_cvtepi32_ps(insert8_epi32([&](int k) { return int(col8[m[k]]); })));
    }
  } else {
    constexpr int NV = 4;
    int i = 0;
    for (; i + 8 * NV <= S; i += 8 * NV) {
      __m256i w[NV], x[NV];
      for (int v = 0; v < NV; ++v)
        w[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + i + 8 * v));
      if (pp.n <= 32u)
        swap_or_not_avx2<true, NV>(pp.n, pp.rank, w, x);
      else
        swap_or_not_avx2<false, NV>(pp.n, pp.rank, w, x);
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(pi + i + 8 * v, _mm256_cvtepi32_ps(x[v]));
    }
    for (; i < S; i += 8) {
      __m256i w[1], x[1];
      w[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + i));
      if (pp.n <= 32u)
        swap_or_not_avx2<true, 1>(pp.n, pp.rank, w, x);
      else
        swap_or_not_avx2<false, 1>(pp.n, pp.rank, w, x);
      _mm256_storeu_ps(pi + i, _mm256_cvtepi32_ps(x[0]));
    }
  }
}
#endif

#if defined(__AVX2__)
// The value passes of encode_sg (dq_sign, dq_normalise, dq_bracket<B>, dq_frac,
// dq_round_up, dq_code<B>) and the planar packing in one AVX2 loop, for
// B in {2, 4, 8} and nb = S*B/8 a multiple of 32: each iteration makes 32 code
// bytes from the P = 8/B vectors of 8 elements that share them.
// gv[i >> rs]: 1/normaliser of the 8 elements from i (rs = 3 or 4: one value
// per 8- or 16-element run; s a multiple of 8, see per_run). w: the S/2 32-bit
// value words unexpanded (element i < S/2 takes the low half of w[i], i >= S/2
// the high half of w[i - S/2]: dq_value_word), read when kStoch; pi (strata)
// read when kCorr. recp: DynamiqTables::cell_rec of width B (B = 8's bracket
// search reads the cell's 16-byte record and cell[c] with plain loads: on the
// Zen 3 guest 8-wide gathers cost more than 8 loads and inserts).
template <int B, bool kStoch, bool kCorr>
void encode_values_avx2_t(const DqLevels& lv, const uint32_t* __restrict recp, const DqRounding& rd,
                          int S, const float* __restrict t, const float* __restrict gv, int rs,
                          const float* __restrict pi, const uint32_t* __restrict w,
                          uint8_t* __restrict out) {
  constexpr int P = 8 / B;
  const int nb = S / P;
  const int h = S / 2;
  const __m256i mid = _mm256_set1_epi32(0x8000), himask = _mm256_set1_epi32(int(0xffff0000u));
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i one_bits = _mm256_set1_epi32(0x3f800000);
  const __m256 zero = _mm256_setzero_ps();
  const float K = 1.0f / rd.gscale;  // a power of two
  const __m256 Kv = _mm256_set1_ps(K);
  const __m256 nK = _mm256_set1_ps(rd.nf * K);
  const __m256 halfK = _mm256_set1_ps(0.5f * K);
  const __m128i gshift = _mm_cvtsi32_si128(int(rd.gshift));
  const __m256i signbit = _mm256_set1_epi32(1 << (B - 1));
  // width 4: levels and inverse gaps in registers (j <= 6)
  __m256 lv8 = zero, ig8 = zero;
  if constexpr (B == 4) {
    alignas(32) float l[8] = {0}, g[8] = {0};
    for (int k = 0; k <= lv.m; ++k) l[k] = lv.level[k];
    for (int k = 0; k < lv.m; ++k) g[k] = lv.invgap[k];
    lv8 = _mm256_load_ps(l);
    ig8 = _mm256_load_ps(g);
  }
  __m256i lb[6];  // width 4: level[k] bits - 1, k = 1..6 (a >= level[k] <=> a > level[k] - 1)
  if constexpr (B == 4)
    for (int k = 1; k < 7; ++k) lb[k - 1] = _mm256_set1_epi32(int32_t(f32_bits(lv.level[k])) - 1);
  const __m256i cbase = _mm256_set1_epi32(int32_t(lv.cell_base));
  const __m128i cshift = _mm_cvtsi32_si128(lv.cell_shift);
  const __m256i clast = _mm256_set1_epi32(lv.ncells - 1);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);

  auto code8 = [&]<bool kHi>(int i) -> __m256i {
    const __m256 x = _mm256_loadu_ps(t + i);
    const __m256 negm = _mm256_cmp_ps(x, zero, _CMP_LT_OQ);  // dq_sign
    const __m256 ax = _mm256_and_ps(x, _mm256_castsi256_ps(absmask));
    const __m256i ab = _mm256_min_epu32(
        _mm256_castps_si256(_mm256_mul_ps(ax, _mm256_broadcast_ss(gv + (i >> rs)))), one_bits);
    const __m256 a = _mm256_castsi256_ps(ab);
    __m256i j;
    __m256 p;
    if constexpr (B == 2) {
      j = _mm256_setzero_si256();
      p = a;
    } else if constexpr (B == 4) {
      j = _mm256_setzero_si256();
      for (int k = 0; k < 6; ++k) j = _mm256_sub_epi32(j, _mm256_cmpgt_epi32(ab, lb[k]));
      p = _mm256_mul_ps(_mm256_sub_ps(a, _mm256_permutevar8x32_ps(lv8, j)),
                        _mm256_permutevar8x32_ps(ig8, j));
    } else {
      __m256i c = _mm256_sra_epi32(_mm256_sub_epi32(ab, cbase), cshift);
      c = _mm256_max_epi32(c, _mm256_setzero_si256());
      c = _mm256_min_epi32(c, clast);
      // j = cell[c] by 8 scalar loads; the cell's record (next, level[j],
      // invgap[j], invgap[j + 1]) by 8 16-byte loads and a 4x4 transpose per
      // 128-bit lane
      alignas(32) int32_t ci[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(ci), c);
      j = insert8_epi32([&](int k) { return lv.cell[ci[k]]; });
      __m256 f[4];
      load_records8(reinterpret_cast<const float*>(recp), ci, f);
      const __m256 next = f[0], l0 = f[1], g0 = f[2], g1 = f[3];
      // step where a >= level[j + 1] (never past m - 1: next is +inf there)
      const __m256i step = _mm256_cmpgt_epi32(_mm256_add_epi32(ab, _mm256_set1_epi32(1)),
                                              _mm256_castps_si256(next));
      j = _mm256_sub_epi32(j, step);
      const __m256 sm = _mm256_castsi256_ps(step);
      p = _mm256_mul_ps(_mm256_sub_ps(a, _mm256_blendv_ps(l0, next, sm)), _mm256_blendv_ps(g0, g1, sm));
    }
    // dq_round_up, scaled by K = 1/gscale (exact: see encode_values_avx512)
    __m256 vK = halfK;
    if constexpr (kStoch) {
      const __m256i wv =
          !kHi ? _mm256_or_si256(
                     _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)), 16), mid)
               : _mm256_or_si256(
                     _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i - h)), himask),
                     mid);
      vK = _mm256_cvtepi32_ps(_mm256_srl_epi32(wv, gshift));
    }
    if constexpr (kCorr) vK = _mm256_fmadd_ps(_mm256_loadu_ps(pi + i), Kv, vK);
    const __m256 side = _mm256_blendv_ps(vK, _mm256_sub_ps(nK, vK), negm);
    const __m256 up = _mm256_cmp_ps(side, _mm256_mul_ps(p, nK), _CMP_LT_OQ);
    j = _mm256_sub_epi32(j, _mm256_castps_si256(up));
    return _mm256_or_si256(j, _mm256_and_si256(_mm256_castps_si256(negm), signbit));
  };

  // element i takes the low half of its word when i < h: for P >= 2 that is
  // jp < P/2 (nb = S/P), for P = 1 the first h positions
  auto codeq = [&](int k) -> __m256i {
    if constexpr (P == 1) {
      return k < h ? code8.template operator()<false>(k) : code8.template operator()<true>(k);
    } else if constexpr (P == 2) {
      return _mm256_or_si256(code8.template operator()<false>(k),
                             _mm256_slli_epi32(code8.template operator()<true>(k + nb), B));
    } else {
      static_assert(P == 4, "widths 2, 4, 8");
      const __m256i c01 = _mm256_or_si256(code8.template operator()<false>(k),
                                          _mm256_slli_epi32(code8.template operator()<false>(k + nb), B));
      const __m256i c23 = _mm256_or_si256(_mm256_slli_epi32(code8.template operator()<true>(k + 2 * nb), 2 * B),
                                          _mm256_slli_epi32(code8.template operator()<true>(k + 3 * nb), 3 * B));
      return _mm256_or_si256(c01, c23);
    }
  };
  for (int kb = 0; kb < nb; kb += 32) {
    __m256i acc[4];
    for (int q = 0; q < 4; ++q) acc[q] = codeq(kb + 8 * q);
    const __m256i ab = _mm256_packus_epi32(acc[0], acc[1]);
    const __m256i cd = _mm256_packus_epi32(acc[2], acc[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kb), bytes);
  }
}

template <int B>
void encode_values_avx2(const DqLevels& lv, const uint32_t* __restrict recp, const DqRounding& rd,
                        int S, const float* __restrict t, const float* __restrict gv, int rs,
                        const float* __restrict pi, const uint32_t* __restrict w,
                        uint8_t* __restrict out) {
  auto go = [&](auto stoch, auto corr) {
    encode_values_avx2_t<B, decltype(stoch)::value, decltype(corr)::value>(lv, recp, rd, S, t, gv, rs,
                                                                          pi, w, out);
  };
  using T = std::true_type;
  using F = std::false_type;
  if (rd.stochastic)
    pi ? go(T(), T()) : go(T(), F());
  else
    pi ? go(F(), T()) : go(F(), F());
}
#endif

#if defined(DQ_HAVE_AVX512)
// load_records8 on 16 lanes: sixteen 16-byte records base + 4 idx[k],
// transposed (out[f] lane k = field f of record k). 16 plain loads and a 4x4
// transpose per 128-bit lane; on the Zen 4 guest cheaper than the 16-lane
// gathers of the same fields.
DQ_AVX512_FN inline void load_records16(const float* base, const int32_t* idx, __m512 out[4]) {
  auto row = [&](int q) DQ_AVX512_FN {  // records q, q + 4, q + 8, q + 12
    __m512 r = _mm512_castps128_ps512(_mm_loadu_ps(base + 4 * idx[q]));
    r = _mm512_insertf32x4(r, _mm_loadu_ps(base + 4 * idx[q + 4]), 1);
    r = _mm512_insertf32x4(r, _mm_loadu_ps(base + 4 * idx[q + 8]), 2);
    return _mm512_insertf32x4(r, _mm_loadu_ps(base + 4 * idx[q + 12]), 3);
  };
  const __m512 r0 = row(0), r1 = row(1), r2 = row(2), r3 = row(3);
  const __m512 t0 = _mm512_unpacklo_ps(r0, r1), t1 = _mm512_unpackhi_ps(r0, r1);
  const __m512 t2 = _mm512_unpacklo_ps(r2, r3), t3 = _mm512_unpackhi_ps(r2, r3);
  out[0] = _mm512_shuffle_ps(t0, t2, 0x44);
  out[1] = _mm512_shuffle_ps(t0, t2, 0xEE);
  out[2] = _mm512_shuffle_ps(t1, t3, 0x44);
  out[3] = _mm512_shuffle_ps(t1, t3, 0xEE);
}

// encode_values_avx2 on 16 lanes with mask registers, for nb = S*B/8 a
// multiple of 16: each iteration makes 16 code bytes from P = 8/B vectors.
//
// dq_round_up is evaluated scaled by K = 1/gscale (a power of two): with
// u = w >> gshift (an integer, gamma = u / K), the rounding compares
// K (pi + gamma) = pi K + u (or K n - (pi K + u) for a negative value) with
// p (n K). Bit-identical to the unscaled comparisons: pi K + u and
// K n - (pi K + u) are integers below 2^24 (exact, as pi + gamma and
// n - (pi + gamma) are), and p (n K) = K RN(p n) exactly unless p n is
// subnormal, where both sides round down (pi + gamma and n - (pi + gamma) are
// >= 2^-17 there). It saves the multiply by gscale, the add of pi (an FMA
// now) and three mask operations per vector.
//
// Instantiated per (stochastic, correlated, width-4 register tables) so the
// loop carries no run-time branches; which half of a Philox word an element
// takes is known per call site (kHi).
template <int B, bool kStoch, bool kCorr, bool kReg4>
DQ_AVX512_FN void encode_values_avx512_t(const DqLevels& lv, const uint32_t* __restrict recp,
                                         const DynamiqTables::Width4Regs& w4, const DqRounding& rd,
                                         int S, const float* __restrict t,
                                         const float* __restrict g16, const float* __restrict pi,
                                         const uint32_t* __restrict w, uint8_t* __restrict out) {
  // g16: the 1/normaliser of each run of 16 elements (S/16 values: s is a
  // multiple of 16; indexing per run, not i / s, keeps an integer division out
  // of the loop); w: the S/2 Philox words of
  // the SG, not expanded (element i < S/2 takes the low half of w[i], element
  // i >= S/2 the high half of w[i - S/2]: dq_value_word)
  const int h = S / 2;
  const __m512i mid = _mm512_set1_epi32(0x8000), himask = _mm512_set1_epi32(int(0xffff0000u));
  constexpr int P = 8 / B;
  const int nb = S / P;
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  const __m512i one_bits = _mm512_set1_epi32(0x3f800000);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512 zero = _mm512_setzero_ps();
  const float K = 1.0f / rd.gscale;  // a power of two
  const __m512 Kv = _mm512_set1_ps(K);
  const __m512 nK = _mm512_set1_ps(rd.nf * K);
  const __m512 halfK = _mm512_set1_ps(0.5f * K);
  const __m512i gshift = _mm512_set1_epi32(int(rd.gshift));
  const __m512i signbit = _mm512_set1_epi32(1 << (B - 1));
  // width 4: levels and inverse gaps in registers (j <= 6), and the bracket
  // search in two 32-entry tables when they fit (w4.ok), else a comparison
  // against each level
  static_assert(!kReg4 || B == 4, "register tables are width 4's");
  __m512 lv16 = zero, ig16 = zero;
  __m512i lb[6], cj0, cj1, cn0, cn1;
  if constexpr (B == 4) {
    lv16 = _mm512_loadu_ps(w4.level16);
    ig16 = _mm512_loadu_ps(w4.invgap16);
    if constexpr (kReg4) {
      cj0 = _mm512_loadu_si512(w4.cell_j);
      cj1 = _mm512_loadu_si512(w4.cell_j + 16);
      cn0 = _mm512_loadu_si512(w4.cell_next);
      cn1 = _mm512_loadu_si512(w4.cell_next + 16);
    } else {
      for (int k = 1; k < 7; ++k) lb[k - 1] = _mm512_set1_epi32(int32_t(f32_bits(lv.level[k])));
    }
  }
  // cells: width 8's table search, width 4's register tables (the last cell below 1.0)
  const __m512i cbase = _mm512_set1_epi32(int32_t(lv.cell_base));
  const __m512i cshift = _mm512_set1_epi32(lv.cell_shift);
  const __m512i clast = _mm512_set1_epi32(kReg4 ? w4.last_cell : lv.ncells - 1);
  const float* __restrict rec = reinterpret_cast<const float*>(recp);

  auto code16 = [&]<bool kHi>(int i) DQ_AVX512_FN -> __m512i {
    const __m512 x = _mm512_loadu_ps(t + i);
    const __mmask16 negm = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);  // dq_sign
    const __m512 ax = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), absmask));
    const __m512i ab =
        _mm512_min_epu32(_mm512_castps_si512(_mm512_mul_ps(ax, _mm512_set1_ps(g16[i >> 4]))), one_bits);
    const __m512 a = _mm512_castsi512_ps(ab);
    __m512i j;
    __m512 p;
    if constexpr (B == 2) {
      j = _mm512_setzero_si512();
      p = a;
    } else if constexpr (B == 4) {
      if constexpr (kReg4) {
        __m512i c = _mm512_srav_epi32(_mm512_sub_epi32(ab, cbase), cshift);
        c = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_setzero_si512()), clast);
        j = _mm512_permutex2var_epi32(cj0, c, cj1);  // cell[c]
        const __m512i next = _mm512_permutex2var_epi32(cn0, c, cn1);
        j = _mm512_mask_add_epi32(j, _mm512_cmpge_epi32_mask(ab, next), j, one);
      } else {
        j = _mm512_setzero_si512();
        for (int k = 0; k < 6; ++k)  // ab >= level[k+1] bits (signed compare, as dq_bracket)
          j = _mm512_mask_add_epi32(j, _mm512_cmpge_epi32_mask(ab, lb[k]), j, one);
      }
      p = _mm512_mul_ps(_mm512_sub_ps(a, _mm512_permutexvar_ps(j, lv16)), _mm512_permutexvar_ps(j, ig16));
    } else {
      __m512i c = _mm512_srav_epi32(_mm512_sub_epi32(ab, cbase), cshift);
      c = _mm512_max_epi32(c, _mm512_setzero_si512());
      c = _mm512_min_epi32(c, clast);
      // j = cell[c] by 16 scalar loads, and the cell's record (next, level[j],
      // invgap[j], invgap[j + 1]) by load_records16: on the Zen 4 guest 1.1x
      // faster than two dependent pairs of 8 x 64-bit gathers (j and next, then
      // level[j] and invgap[j])
      alignas(64) int32_t ci[16];
      _mm512_store_si512(ci, c);
      j = _mm512_inserti64x4(_mm512_castsi256_si512(insert8_epi32([&](int k) { return lv.cell[ci[k]]; })),
                             insert8_epi32([&](int k) { return lv.cell[ci[k + 8]]; }), 1);
      __m512 f[4];
      load_records16(rec, ci, f);
      const __m512 next = f[0], l0 = f[1], g0 = f[2], g1 = f[3];
      // step where a >= level[j + 1] (never past m - 1: next is +inf there)
      const __mmask16 step = _mm512_cmpge_epi32_mask(ab, _mm512_castps_si512(next));
      j = _mm512_mask_add_epi32(j, step, j, one);
      p = _mm512_mul_ps(_mm512_sub_ps(a, _mm512_mask_blend_ps(step, l0, next)),
                        _mm512_mask_blend_ps(step, g0, g1));
    }
    // dq_round_up, scaled by K (see above)
    __m512 vK = halfK;
    if constexpr (kStoch) {
      const __m512i wv = !kHi ? _mm512_or_si512(_mm512_slli_epi32(_mm512_loadu_si512(w + i), 16), mid)
                              : _mm512_ternarylogic_epi32(_mm512_loadu_si512(w + i - h), himask, mid, 0xEA);
      vK = _mm512_cvtepi32_ps(_mm512_srlv_epi32(wv, gshift));
    }
    if constexpr (kCorr) vK = _mm512_fmadd_ps(_mm512_loadu_ps(pi + i), Kv, vK);  // exact
    const __m512 side = _mm512_mask_sub_ps(vK, negm, nK, vK);      // negative: K n - K v
    const __mmask16 up = _mm512_cmp_ps_mask(side, _mm512_mul_ps(p, nK), _CMP_LT_OQ);
    j = _mm512_mask_add_epi32(j, up, j, one);
    return _mm512_mask_or_epi32(j, negm, j, signbit);
  };

  // element i takes the low half of its word when i < h: for P >= 2 that is
  // jp < P/2 (nb = S/P), for P = 1 the first h positions
  auto put = [&](int k, __m512i c) DQ_AVX512_FN {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm512_cvtepi32_epi8(c));
  };
  auto code = [&]<bool kHi>(int i, int shift) DQ_AVX512_FN {
    return _mm512_slli_epi32(code16.template operator()<kHi>(i), shift);
  };
  if constexpr (P == 1) {
    for (int k = 0; k < h; k += 16) put(k, code16.template operator()<false>(k));
    for (int k = h; k < nb; k += 16) put(k, code16.template operator()<true>(k));
  } else if constexpr (P == 2) {
    for (int k = 0; k < nb; k += 16)
      put(k, _mm512_or_si512(code16.template operator()<false>(k), code.template operator()<true>(k + nb, B)));
  } else {
    static_assert(P == 4, "widths 2, 4, 8");
    for (int k = 0; k < nb; k += 16) {
      const __m512i c01 =
          _mm512_or_si512(code16.template operator()<false>(k), code.template operator()<false>(k + nb, B));
      const __m512i c23 = _mm512_or_si512(code.template operator()<true>(k + 2 * nb, 2 * B),
                                          code.template operator()<true>(k + 3 * nb, 3 * B));
      put(k, _mm512_or_si512(c01, c23));
    }
  }
}

template <int B>
DQ_AVX512_FN void encode_values_avx512(const DqLevels& lv, const uint32_t* __restrict recp,
                                       const DynamiqTables::Width4Regs& w4, const DqRounding& rd,
                                       int S, const float* __restrict t, const float* __restrict g16,
                                       const float* __restrict pi, const uint32_t* __restrict w,
                                       uint8_t* __restrict out) {
  auto go = [&](auto stoch, auto corr) {
    constexpr bool kS = decltype(stoch)::value, kC = decltype(corr)::value;
    if constexpr (B == 4) {
      if (w4.ok) {
        encode_values_avx512_t<B, kS, kC, true>(lv, recp, w4, rd, S, t, g16, pi, w, out);
        return;
      }
    }
    encode_values_avx512_t<B, kS, kC, false>(lv, recp, w4, rd, S, t, g16, pi, w, out);
  };
  using T = std::true_type;
  using F = std::false_type;
  if (!rd.stochastic) {
    if (pi != nullptr)
      go(F(), T());  // not made by make_rounding (nearest is never correlated), but exact
    else
      go(F(), F());
  } else if (pi != nullptr) {
    go(T(), T());
  } else {
    go(T(), F());
  }
}

// decode_values_avx2 on 16 lanes (nb a multiple of 16, s a multiple of 16).
template <int B>
DQ_AVX512_FN void decode_values_avx512(const float* __restrict dec, const uint8_t* __restrict codes,
                                       int S, const float* __restrict g16,
                                       const float* __restrict base, float* __restrict tile) {
  // g16: the decoded group scale of each run of 16 elements (S/16 values)
  constexpr int P = 8 / B;
  const int nb = S / P;
  const __m512i mask = _mm512_set1_epi32((1 << B) - 1);
  // width 8: dec[c] = +-level[c & 127] with the sign in bit 7 (the table's
  // second half is the exact negation of its first), so the magnitude comes
  // from the 128 levels in eight registers (four vpermt2ps, the index's bits
  // 5-6 pick among them) and the sign is or-ed in: cheaper than a 16-lane gather
  __m512 t[8];
  if constexpr (B == 2) {
    t[0] = _mm512_setr_ps(dec[0], dec[1], dec[2], dec[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  } else if constexpr (B == 4) {
    t[0] = _mm512_loadu_ps(dec);
  } else {
    for (int q = 0; q < 8; ++q) t[q] = _mm512_loadu_ps(dec + 16 * q);
  }
  const __m512i bit5 = _mm512_set1_epi32(32), bit6 = _mm512_set1_epi32(64);
  const __m512i signbit = _mm512_set1_epi32(int(0x80000000u));
  for (int k = 0; k < nb; k += 16) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k)));
    for (int j = 0; j < P; ++j) {
      const int i = k + j * nb;
      const __m512i c = _mm512_and_si512(_mm512_srli_epi32(bytes, j * B), mask);
      __m512 d;
      if constexpr (B == 2 || B == 4) {
        d = _mm512_permutexvar_ps(c, t[0]);
      } else {
        const __mmask16 m5 = _mm512_test_epi32_mask(c, bit5), m6 = _mm512_test_epi32_mask(c, bit6);
        const __m512 lo = _mm512_mask_blend_ps(m5, _mm512_permutex2var_ps(t[0], c, t[1]),
                                               _mm512_permutex2var_ps(t[2], c, t[3]));
        const __m512 hi = _mm512_mask_blend_ps(m5, _mm512_permutex2var_ps(t[4], c, t[5]),
                                               _mm512_permutex2var_ps(t[6], c, t[7]));
        const __m512i mag = _mm512_castps_si512(_mm512_mask_blend_ps(m6, lo, hi));
        // mag | ((c << 24) & sign bit)
        d = _mm512_castsi512_ps(
            _mm512_ternarylogic_epi32(mag, _mm512_slli_epi32(c, 24), signbit, 0xF8));
      }
      const __m512 s16 = _mm512_set1_ps(g16[i >> 4]);
      if (base)
        _mm512_storeu_ps(tile + i, _mm512_fmadd_ps(d, s16, _mm512_loadu_ps(base + i)));
      else
        _mm512_storeu_ps(tile + i, _mm512_mul_ps(d, s16));
    }
  }
}
#endif

#if defined(__AVX2__)
// dq_group_scale_up for groups [0, G8) (G8 a multiple of 8): codes into rk,
// 1/normaliser into ik. rrec: DynamiqTables::r255_rec.
void group_scales_up_avx2(const float* __restrict gmax, float Msg, const float* __restrict rrec,
                          int G8, uint32_t* __restrict rk, float* __restrict ik) {
  const int32_t mb = int32_t(f32_bits(Msg));
  const __m256 Mq = _mm256_set1_ps(bits_f32(mb > 0 ? uint32_t(mb) : 0x3f800000u));
  const __m256i mlive = _mm256_set1_epi32(mb > 0 ? -1 : 0);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i c255 = _mm256_set1_epi32(255);
  const __m256i t255 = _mm256_set1_epi32(0x437f0000);
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int k = 0; k < G8; k += 8) {
    const __m256 g = _mm256_loadu_ps(gmax + k);
    const __m256i gb = _mm256_castps_si256(g);
    const __m256i live = _mm256_and_si256(_mm256_cmpgt_epi32(gb, zero), mlive);
    const __m256 t0 = _mm256_mul_ps(_mm256_div_ps(g, Mq), _mm256_set1_ps(255.0f));
    const __m256i tb = _mm256_min_epu32(_mm256_castps_si256(t0), t255);
    __m256i r = _mm256_cvttps_epi32(_mm256_castsi256_ps(tb));  // floor (t >= 0)
    r = _mm256_sub_epi32(r, _mm256_cmpgt_epi32(tb, _mm256_castps_si256(_mm256_cvtepi32_ps(r))));
    r = _mm256_min_epi32(r, c255);
    // The fix-ups of dq_group_scale_up read R255 at r, r - 1 (or r after the
    // step up) and the final r in {r - 1, r, r + 1}: all three from r's
    // 16-byte record (r255_rec), by 8 plain loads and a 4x4 transpose per
    // 128-bit lane (on the Zen 3 guest three 8-wide gathers cost more).
    alignas(32) int32_t ri[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ri), r);
    __m256 f[4];
    load_records8(rrec, ri, f);
    const __m256i sm = _mm256_castps_si256(_mm256_mul_ps(f[0], Mq));
    const __m256i s0 = _mm256_castps_si256(_mm256_mul_ps(f[1], Mq));
    const __m256i sp = _mm256_castps_si256(_mm256_mul_ps(f[2], Mq));
    // up: r < 255 and R255[r]*M < g
    const __m256i up = _mm256_and_si256(_mm256_cmpgt_epi32(c255, r), _mm256_cmpgt_epi32(gb, s0));
    const __m256i r1 = _mm256_sub_epi32(r, up);
    // down: r1 > 0 and R255[r1-1]*M >= g, R255[r1-1] = up ? R255[r] : R255[max(r-1, 0)]
    const __m256i sdown = _mm256_blendv_epi8(sm, s0, up);
    const __m256i dn = _mm256_andnot_si256(_mm256_cmpgt_epi32(gb, sdown), _mm256_cmpgt_epi32(r1, zero));
    r = _mm256_and_si256(_mm256_add_epi32(r1, dn), live);
    // R255[r]*M for the final r (don't care when not live: pos below is 0)
    const __m256i sfin = _mm256_blendv_epi8(
        _mm256_blendv_epi8(s0, sm, _mm256_andnot_si256(up, dn)), sp, _mm256_andnot_si256(dn, up));
    const __m256 sc = _mm256_castsi256_ps(sfin);
    const __m256i pos = _mm256_and_si256(live, _mm256_cmpgt_epi32(_mm256_castps_si256(sc), zero));
    const __m256 inv = _mm256_div_ps(one, _mm256_blendv_ps(one, sc, _mm256_castsi256_ps(pos)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rk + k), r);
    _mm256_storeu_ps(ik + k, _mm256_and_ps(inv, _mm256_castsi256_ps(pos)));
  }
}

#if defined(DQ_HAVE_AVX512)
// Group maxima of |t| for s = 16 and G a multiple of 16: sixteen groups (one
// vector each) reduced together by a 4-level transposing max tree (each level
// halves every segment with two vpermt2d and a max), so lane k of the result
// is group k's maximum. Returns the overall max (bit patterns, as group_max_avx2).
DQ_AVX512_FN uint32_t group_max16_avx512(const float* __restrict t, int G, float* __restrict gmax) {
  // level L (segment n = 16 >> L lanes in, n/2 out): out lane o takes segment
  // g = o / (n/2) of x (g < 16/n) or of y, first or second half
  alignas(64) static const int32_t idx[4][2][16] = {
      {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
       {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
      {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
       {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}},
      {{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
       {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31}},
      {{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
       {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}}};
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  __m512i all = _mm512_setzero_si512();
  for (int k0 = 0; k0 < G; k0 += 16) {
    __m512i v[16];
    for (int k = 0; k < 16; ++k) v[k] = _mm512_and_si512(_mm512_loadu_si512(t + (k0 + k) * 16), absmask);
    for (int L = 0, cnt = 16; L < 4; ++L, cnt /= 2) {
      const __m512i lo = _mm512_load_si512(idx[L][0]), hi = _mm512_load_si512(idx[L][1]);
      for (int q = 0; q < cnt / 2; ++q)
        v[q] = _mm512_max_epu32(_mm512_permutex2var_epi32(v[2 * q], lo, v[2 * q + 1]),
                                _mm512_permutex2var_epi32(v[2 * q], hi, v[2 * q + 1]));
    }
    _mm512_storeu_si512(gmax + k0, v[0]);
    all = _mm512_max_epu32(all, v[0]);
  }
  return _mm512_reduce_max_epu32(all);
}

// group_scales_up_avx2 on 16 groups per iteration (G16 a multiple of 16).
DQ_AVX512_FN void group_scales_up_avx512(const float* __restrict gmax, float Msg,
                                         const float* __restrict rrec, int G16,
                                         uint32_t* __restrict rk, float* __restrict ik) {
  const int32_t mb = int32_t(f32_bits(Msg));
  const __m512 Mq = _mm512_set1_ps(bits_f32(mb > 0 ? uint32_t(mb) : 0x3f800000u));
  const __mmask16 mlive = mb > 0 ? __mmask16(0xffff) : __mmask16(0);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i c255 = _mm512_set1_epi32(255);
  const __m512i t255 = _mm512_set1_epi32(0x437f0000);
  const __m512i one_i = _mm512_set1_epi32(1);
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int k = 0; k < G16; k += 16) {
    const __m512 g = _mm512_loadu_ps(gmax + k);
    const __m512i gb = _mm512_castps_si512(g);
    const __mmask16 live = _mm512_cmpgt_epi32_mask(gb, zero) & mlive;
    const __m512 t0 = _mm512_mul_ps(_mm512_div_ps(g, Mq), _mm512_set1_ps(255.0f));
    const __m512i tb = _mm512_min_epu32(_mm512_castps_si512(t0), t255);
    __m512i r = _mm512_cvttps_epi32(_mm512_castsi512_ps(tb));  // floor (t >= 0)
    r = _mm512_mask_add_epi32(r, _mm512_cmpgt_epi32_mask(tb, _mm512_castps_si512(_mm512_cvtepi32_ps(r))), r, one_i);
    r = _mm512_min_epi32(r, c255);
    // R255 at max(r - 1, 0), r and min(r + 1, 255) from r's record (r255_rec;
    // as group_scales_up_avx2)
    alignas(64) int32_t ri[16];
    _mm512_store_si512(ri, r);
    __m512 f[4];
    load_records16(rrec, ri, f);
    const __m512i sm = _mm512_castps_si512(_mm512_mul_ps(f[0], Mq));
    const __m512i s0 = _mm512_castps_si512(_mm512_mul_ps(f[1], Mq));
    const __m512i sp = _mm512_castps_si512(_mm512_mul_ps(f[2], Mq));
    const __mmask16 up = _mm512_cmpgt_epi32_mask(c255, r) & _mm512_cmpgt_epi32_mask(gb, s0);
    const __m512i r1 = _mm512_mask_add_epi32(r, up, r, one_i);
    const __m512i sdown = _mm512_mask_blend_epi32(up, sm, s0);
    const __mmask16 dn = _mm512_cmpge_epi32_mask(sdown, gb) & _mm512_cmpgt_epi32_mask(r1, zero);
    r = _mm512_maskz_mov_epi32(live, _mm512_mask_sub_epi32(r1, dn, r1, one_i));
    const __m512i sfin =
        _mm512_mask_blend_epi32(__mmask16(dn & ~up), _mm512_mask_blend_epi32(__mmask16(up & ~dn), s0, sp), sm);
    const __mmask16 pos = live & _mm512_cmpgt_epi32_mask(sfin, zero);
    const __m512 inv = _mm512_div_ps(one, _mm512_mask_blend_ps(pos, one, _mm512_castsi512_ps(sfin)));
    _mm512_storeu_si512(rk + k, r);
    _mm512_storeu_ps(ik + k, _mm512_maskz_mov_ps(pos, inv));
  }
}
#endif

// Group maxima of |t| on the bit patterns (s a multiple of 8); returns the overall max.
uint32_t group_max_avx2(const float* __restrict t, int G, int s, float* __restrict gmax) {
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  __m256i all = _mm256_setzero_si256();
  for (int k = 0; k < G; ++k) {
    __m256i m = _mm256_setzero_si256();
    for (int i = 0; i < s; i += 8)
      m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + k * s + i)), absmask));
    all = _mm256_max_epu32(all, m);
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    gmax[k] = bits_f32(uint32_t(_mm_cvtsi128_si32(h)));
  }
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  return uint32_t(_mm_cvtsi128_si32(h));
}
#endif

#if defined(__AVX2__)
// The value loop of decode_sg for B in {2, 4, 8} and nb = S*B/8 a multiple of 8:
// tile = fma(decode[code], scale, base) (base != nullptr) or decode[code] * scale,
// scale = gv[i >> rs] for the 8 elements from i (per_run: s a multiple of 8).
template <int B>
void decode_values_avx2(const float* __restrict dec, const uint8_t* __restrict codes, int S,
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
#endif

// out[k*s + i] = v[k] for i < s: the per-element copy of per-group values.
inline void broadcast_groups(const float* __restrict v, int G, int s, float* __restrict out) {
#if defined(__AVX2__)
  if (s % 8 == 0) {
    for (int k = 0; k < G; ++k) {
      const __m256 b = _mm256_broadcast_ss(v + k);
      for (int i = 0; i < s; i += 8) _mm256_storeu_ps(out + k * s + i, b);
    }
    return;
  }
#endif
  for (int k = 0; k < G; ++k)
    for (int i = 0; i < s; ++i) out[k * s + i] = v[k];
}

// One value per 16-element run from per-group values (s a multiple of 16):
// the group values themselves when s = 16 (no copy: a copy loop with one
// iteration per group cost more than the division it replaces), else each
// repeated s/16 times in buf (S/16 entries).
inline const float* per_run16(const float* v, int G, int s, float* buf) {
  if (s == 16) return v;
  broadcast_groups(v, G, s / 16, buf);
  return buf;
}

// One value per run of 2^rs elements (s a multiple of 8): runs of 16 when s is
// a multiple of 16 (per_run16), else of 8 (v itself when s = 8, else each
// value repeated s/8 times in buf, S/8 entries). Run r covers elements
// [r << rs, (r + 1) << rs).
inline const float* per_run(const float* v, int G, int s, float* buf, int& rs) {
  if (s % 16 == 0) {
    rs = 4;
    return per_run16(v, G, s, buf);
  }
  rs = 3;
  if (s == 8) return v;
  broadcast_groups(v, G, s / 8, buf);
  return buf;
}

// Strata of this rank for the S elements of SG src (0 when not correlated).
// One loop per permutation kind, so each is a simple vectorisable loop.
void fill_strata(const DqRounding& rd, const uint8_t* col8, int64_t src, int S,
                 uint32_t* __restrict sw, float* __restrict pi) {
  if (!rd.correlated) {
    for (int i = 0; i < S; ++i) pi[i] = 0.0f;
    return;
  }
  fill_words(rd.key, uint64_t(src) * uint64_t(S / 4), kPurposePermutation, 0, S, sw);
  const PermParams pp = rd.perm;
#if defined(DQ_HAVE_AVX512)
  if (S % 16 == 0 && cpu_avx512()) {
    fill_strata_avx512(pp, col8, S, sw, pi);
    return;
  }
#endif
#if defined(__AVX2__)
  if (S % 8 == 0) {
    fill_strata_avx2(pp, col8, S, sw, pi);
    return;
  }
#endif
  if (pp.n == 2) {
    const uint32_t r = pp.rank;
    for (int i = 0; i < S; ++i) pi[i] = float(r ^ (sw[i] >> 31));
  } else if (pp.n <= uint32_t(kPermTableMaxN)) {
    const int32_t* __restrict col = pp.column;
    const uint32_t nf = pp.nfact;
    for (int i = 0; i < S; ++i) pi[i] = float(col[int32_t(perm_mulhi(sw[i], nf))]);
  } else {
    const uint32_t n = pp.n, rank = pp.rank;
    if (n <= 32u)
      for (int i = 0; i < S; ++i) pi[i] = float(int32_t(perm_swap_or_not_t<true>(n, rank, sw[i])));
    else
      for (int i = 0; i < S; ++i) pi[i] = float(int32_t(perm_swap_or_not_t<false>(n, rank, sw[i])));
  }
}

// Table passes as functions taking the levels by value: gcc then keeps the
// table pointers in registers and vectorises the gathers (a struct copied in
// the caller stays in memory and blocks it).
template <int B>
__attribute__((noinline)) void pass_bracket(const DqLevels lv, const float* __restrict a,
                                            int32_t* __restrict j, int S) {
  for (int i = 0; i < S; ++i) j[i] = dq_bracket<B>(lv, a[i]);
}

__attribute__((noinline)) void pass_frac(const DqLevels lv, const float* __restrict a,
                                         const int32_t* __restrict j, float* __restrict p, int S) {
  for (int i = 0; i < S; ++i) p[i] = dq_frac(lv, a[i], j[i]);
}

// ---- encode one SG of width B from ws.tile into out -------------------------------
template <int B>
void encode_sg(const Ctx& cx, const DqRounding& rd, int64_t src, Work& ws, uint8_t* out) {
  const int S = cx.f.S, s = cx.f.s, G = S / s;
  const float* __restrict t = ws.tile.data();
  if constexpr (B == 16) {
    uint16_t* __restrict h = reinterpret_cast<uint16_t*>(ws.codes.data());
    for (int i = 0; i < S; ++i) h[i] = f32_to_bf16(t[i]);
    std::memcpy(out, h, size_t(2 * S));  // little-endian host
    return;
  } else {
    // Group maxima on the bit patterns of |t| (same order as the floats for
    // non-nan values; any nan or inf makes the max >= 0x7f800000).
    const uint32_t* __restrict tb = reinterpret_cast<const uint32_t*>(t);
    float* __restrict gmax = ws.gmax.data();
    uint32_t mbits = 0;
#if defined(DQ_HAVE_AVX512)
    if (s == 16 && G % 16 == 0 && cpu_avx512()) {
      mbits = group_max16_avx512(t, G, gmax);
    } else
#endif
#if defined(__AVX2__)
    if (s % 8 == 0) {
      mbits = group_max_avx2(t, G, s, gmax);
    } else
#endif
    for (int k = 0; k < G; ++k) {
      uint32_t m = 0;
      for (int i = 0; i < s; ++i) {
        const uint32_t v = tb[k * s + i] & 0x7fffffffu;
        m = v > m ? v : m;
      }
      gmax[k] = bits_f32(m);
      mbits = m > mbits ? m : mbits;
    }
    const bool bad = mbits >= 0x7f800000u;
    const float M = bits_f32(mbits);
    // fast: the fused AVX2/AVX-512 value loop applies (it reads w only when
    // stochastic and pi only when correlated, the 16-bit words unexpanded, and
    // one 1/normaliser per 8-element run (AVX2) or 16-element run (AVX-512,
    // s a multiple of 16: one group per vector).
#if defined(__AVX2__)
    const bool fast = B >= 2 && (S * B / 8) % 32 == 0 && s % 8 == 0;
#else
    constexpr bool fast = false;
#endif
#if defined(DQ_HAVE_AVX512)
    const bool v512 = fast && s % 16 == 0 && cpu_avx512();
#endif
    // scales
    float* __restrict inv_e = ws.inv_e.data();
    uint8_t* codes_out;
    if (cx.f.hierarchical) {
      const uint16_t hb = bad ? uint16_t(0x7fc0u) : dq_sg_scale_bits(M);
      const float Msg = bf16_to_f32(hb);
      put_bf16(out, hb);
      if (bad) {
        for (int k = 0; k < G; ++k) {
          out[2 + k] = 0;
          ws.ginv[size_t(k)] = 0.0f;
        }
      } else if (cx.stochastic_scales) {
        uint32_t gw[4] = {0, 0, 0, 0};
        for (int k = 0; k < G; ++k) {
          if (k % 4 == 0) {
            const Philox4x32 r =
                dq_draw(rd.key, uint64_t(src) * uint64_t((G + 3) / 4) + uint64_t(k / 4),
                        kPurposeGroupScale, rd.rank);
            for (int j = 0; j < 4; ++j) gw[j] = r.v[j];
          }
          const DqGroupScale gs = dq_group_scale_stochastic(gmax[k], Msg, cx.tb.r255, gw[k % 4]);
          out[2 + k] = gs.r;
          ws.ginv[size_t(k)] = gs.inv;
        }
      } else {
        // one vectorisable loop over the groups (scale codes into a uint32 array
        // first: byte stores would alias the inputs)
        uint32_t* __restrict rk = ws.gr.data();
        float* __restrict ik = ws.ginv.data();
        const float* __restrict r255 = cx.tb.r255;
        int k0 = 0;
#if defined(DQ_HAVE_AVX512)
        if (cpu_avx512()) {
          k0 = G - G % 16;
          group_scales_up_avx512(gmax, Msg, cx.tables.r255_rec(), k0, rk, ik);
        }
#endif
#if defined(__AVX2__)
        {
          const int k8 = G - (G - k0) % 8;
          group_scales_up_avx2(gmax + k0, Msg, cx.tables.r255_rec(), k8 - k0, rk + k0, ik + k0);
          k0 = k8;
        }
#endif
        for (int k = k0; k < G; ++k) {
          const DqGroupScale gs = dq_group_scale_up(gmax[k], Msg, r255);
          rk[k] = gs.r;
          ik[k] = gs.inv;
        }
        for (int k = 0; k < G; ++k) out[2 + k] = uint8_t(rk[k]);
      }
      codes_out = out + 2 + G;
    } else {
      for (int k = 0; k < G; ++k) {
        uint16_t hb;
        DqGroupScale gs = dq_group_scale_flat(gmax[k], hb);
        if (bad) {
          hb = 0x7fc0u;
          gs.inv = 0.0f;
        }
        put_bf16(out + 2 * k, hb);
        ws.ginv[size_t(k)] = gs.inv;
      }
      codes_out = out + 2 * G;
    }
    // per-element 1/normaliser for the portable passes
    if (!fast) broadcast_groups(ws.ginv.data(), G, s, inv_e);
    // random words: private (value rounding) and shared (strata)
    uint32_t* __restrict w = ws.words.data();
    float* __restrict pi = ws.pi.data();
    if (rd.stochastic) {
      // S/8 Philox calls give S/2 words; each word's low half rounds element
      // k < S/2 and its high half element k + S/2 (dq_value_word)
      fill_words(rd.key, uint64_t(src) * uint64_t(S / 8), kPurposeValue, rd.rank, S / 2, w);
      if (!fast) expand_u16_words(S, w);
    } else if (!fast) {
      for (int i = 0; i < S; ++i) w[i] = 0;
    }
    if (rd.correlated || !fast) fill_strata(rd, ws.col8, src, S, ws.swords.data(), pi);
    const DqLevels lv = cx.tb.lv[dynamiq_width_index(B)];
#if defined(__AVX2__)
    if constexpr (B >= 2) {
      if (fast) {
        const int wi = dynamiq_width_index(B);
#if defined(DQ_HAVE_AVX512)
        if (v512) {
          encode_values_avx512<B>(lv, cx.tables.cell_rec(wi), cx.tables.width4_regs(), rd, S, t,
                                  per_run16(ws.ginv.data(), G, s, ws.grun.data()),
                                  rd.correlated ? pi : nullptr, w, codes_out);
          return;
        }
#endif
        int rs = 0;
        const float* gv = per_run(ws.ginv.data(), G, s, ws.grun.data(), rs);
        encode_values_avx2<B>(lv, cx.tables.cell_rec(wi), rd, S, t, gv, rs,
                              rd.correlated ? pi : nullptr, w, codes_out);
        return;
      }
    }
#endif
    // codes: the steps of dq_encode_value as separate passes (each vectorises)
    uint32_t* __restrict c = ws.codes32.data();
    const DqRounding r = rd;
    if constexpr (B == 1) {
      for (int i = 0; i < S; ++i) c[i] = dq_encode_sign(t[i], inv_e[i], pi[i], w[i], r);
    } else {
      float* __restrict a = ws.a.data();
      float* __restrict pr = ws.p.data();
      int32_t* __restrict jj = ws.j.data();
      for (int i = 0; i < S; ++i) a[i] = dq_normalise(t[i], inv_e[i]);
      if constexpr (B == 2) {
        // levels {0, 1}: bracket 0 and dq_frac(a, 0) = (a - 0) * 1 = a exactly
        for (int i = 0; i < S; ++i) {
          jj[i] = 0;
          pr[i] = a[i];
        }
      } else {
        pass_bracket<B>(lv, a, jj, S);
        pass_frac(lv, a, jj, pr, S);
      }
      for (int i = 0; i < S; ++i) {
        const uint32_t neg = dq_sign(t[i]);
        c[i] = dq_code<B>(neg, jj[i], dq_round_up(pr[i], pi[i], w[i], neg, r));
      }
    }
    // planar packing
    constexpr int P = 8 / B;
    const int nb = S / P;
    uint8_t* __restrict o = codes_out;
    for (int k = 0; k < nb; ++k) {
      uint32_t byte = 0;
      for (int j = 0; j < P; ++j) byte |= c[k + j * nb] << (j * B);
      o[k] = uint8_t(byte);
    }
  }
}

// ---- decode one SG of width B into tile (tile = base + value when base) ----------
template <int B>
void decode_sg(const Ctx& cx, const uint8_t* in, const float* __restrict base, Work& ws,
               float* __restrict tile) {
  const int S = cx.f.S, s = cx.f.s, G = S / s;
  if constexpr (B == 16) {
    for (int i = 0; i < S; ++i) {
      const float v = bf16_to_f32(uint16_t(in[2 * i] | (uint16_t(in[2 * i + 1]) << 8)));
      tile[i] = base ? base[i] + v : v;
    }
    return;
  } else {
    float* __restrict sc = ws.scale_e.data();
    const uint8_t* codes;
    float* __restrict gsc = ws.gmax.data();  // G decoded group scales
    if (cx.f.hierarchical) {
      const float Msg = bf16_to_f32(uint16_t(in[0] | (uint16_t(in[1]) << 8)));
      for (int k = 0; k < G; ++k) gsc[k] = cx.tb.r255[in[2 + k]] * Msg;
      codes = in + 2 + G;
    } else {
      for (int k = 0; k < G; ++k)
        gsc[k] = bf16_to_f32(uint16_t(in[2 * k] | (uint16_t(in[2 * k + 1]) << 8)));
      codes = in + 2 * G;
    }
    const float* __restrict dec = cx.tb.lv[dynamiq_width_index(B)].decode;
    constexpr int P = 8 / B;
    constexpr uint32_t mask = (1u << B) - 1u;
    const int nb = S / P;
#if defined(DQ_HAVE_AVX512)
    if constexpr (B >= 2) {
      // one group per 16-lane vector: one scale per 16-element run, broadcast in the loop
      if (nb % 16 == 0 && s % 16 == 0 && cpu_avx512()) {
        decode_values_avx512<B>(dec, codes, S, per_run16(gsc, G, s, ws.grun.data()), base, tile);
        return;
      }
    }
#endif
#if defined(__AVX2__)
    if constexpr (B >= 2) {
      if (nb % 8 == 0 && s % 8 == 0) {
        int rs = 0;
        const float* gv = per_run(gsc, G, s, ws.grun.data(), rs);
        decode_values_avx2<B>(dec, codes, S, gv, rs, base, tile);
        return;
      }
    }
#endif
    broadcast_groups(gsc, G, s, sc);
    for (int j = 0; j < P; ++j) {
      float* __restrict tj = tile + j * nb;
      const float* __restrict sj = sc + j * nb;
      if (base) {
        const float* __restrict bj = base + j * nb;
        for (int k = 0; k < nb; ++k)
          tj[k] = std::fma(dec[(uint32_t(codes[k]) >> (j * B)) & mask], sj[k], bj[k]);
      } else {
        for (int k = 0; k < nb; ++k) tj[k] = dec[(uint32_t(codes[k]) >> (j * B)) & mask] * sj[k];
      }
    }
  }
}

// Runtime width -> compile-time B.
template <typename F>
inline void dispatch_width(int b, F&& f) {
  switch (b) {
    case 1: f(std::integral_constant<int, 1>()); return;
    case 2: f(std::integral_constant<int, 2>()); return;
    case 4: f(std::integral_constant<int, 4>()); return;
    case 8: f(std::integral_constant<int, 8>()); return;
    case 16: f(std::integral_constant<int, 16>()); return;
  }
  throw Error("dynamiq: width " + std::to_string(b) + " is not one of 1, 2, 4, 8, 16");
}

inline void zero_padding(const Plan& plan, int64_t src, float* tile) {
  const int64_t cnt = plan.unit_elem_count(src);
  for (int64_t i = cnt; i < plan.unit; ++i) tile[i] = 0.0f;
}

}  // namespace

// ================================================================ codec ====

// Units to prefetch ahead of the one being loaded: about 8 KiB of local data
// (fp32 1 KiB units: 8 ahead; bf16: 16). Measured on the fused fp32 mix5 kernel
// at 64 MiB with the hook's kind of plan (super-groups read at scattered
// places in width order, means subtracted), ns/element: 1, 2, 4, 8, 16, 32 KiB
// ahead gave 1.38-1.49, 1.23-1.32, 1.28-1.36, 1.12-1.19, 1.20-1.22, 1.14-1.19
// (the previous revision, no prefetch: 1.65-1.80; the hardware prefetchers
// cannot follow the jumps).
// With super-groups read in order, 4 KiB was best (1.06-1.11 against 1.15-1.17).
// Super-groups per thread below which a call does not split (256 x 256
// elements: ~0.3 ms of fused work, against ~10-50 us to wake a helper), and
// the longest run of super-groups a thread claims at a time (~60 us of fused
// work; the prefetch stops at a run's end: 64-unit runs made the 2-thread
// fused kernel 4-5 % slower on single-width plans).
constexpr int64_t kMinUnitsPerThread = 256;
constexpr int64_t kUnitsPerRun = 256;

inline int64_t prefetch_ahead(const Plan& plan) {
  const int64_t unit_bytes = int64_t(plan.unit) * dtype_size(plan.dtype);
  return std::max<int64_t>(1, 8192 / std::max<int64_t>(1, unit_bytes));
}

DynamiqCodec::DynamiqCodec(const DynamiqParams& p) : p_(p), tables_(p) {}

size_t DynamiqCodec::check_block(const Plan& plan, const Block& b) const {
  const DynamiqFormat& f = p_.fmt;
  DQ_CHECK(plan.unit == f.S, "dynamiq codec: plan.unit (" + std::to_string(plan.unit) +
                                 ") differs from the super-group size S (" + std::to_string(f.S) +
                                 ")");
  DQ_CHECK(plan.num_units == ceil_div<int64_t>(plan.numel, plan.unit),
           "dynamiq codec: plan.num_units inconsistent with numel");
  DQ_CHECK(plan.bits.size() == size_t(plan.num_units), "dynamiq codec: plan.bits has the wrong size");
  DQ_CHECK(plan.order.empty() || plan.order.size() == size_t(plan.num_units),
           "dynamiq codec: plan.order has the wrong size");
  DQ_CHECK(plan.wire_offset.size() == size_t(plan.num_units) + 1,
           "dynamiq codec: plan.wire_offset has the wrong size");
  DQ_CHECK(b.w0 >= 0 && b.w0 <= b.w1 && b.w1 <= plan.num_units, "dynamiq codec: block out of range");
  int64_t bytes = 0;
  for (int64_t w = b.w0; w < b.w1; ++w) {
    const int64_t src = plan.src_unit(w);
    DQ_CHECK(src >= 0 && src < plan.num_units, "dynamiq codec: plan.order entry out of range");
    const int bits = plan.bits[size_t(src)];
    DQ_CHECK(dynamiq_width_index(bits) >= 0,
             "dynamiq codec: width " + std::to_string(bits) + " is not one of 1, 2, 4, 8, 16");
    const int64_t sg = dynamiq_sg_bytes(bits, f);
    DQ_CHECK(plan.wire_offset[size_t(w) + 1] - plan.wire_offset[size_t(w)] == sg,
             "dynamiq codec: plan.wire_offset disagrees with plan.bits at wire position " +
                 std::to_string(w) + " (fill it with dynamiq_fill_wire_offsets)");
    bytes += sg;
  }
  return size_t(bytes);
}

size_t DynamiqCodec::static_bytes(const Plan& plan, const Block& b) const {
  return check_block(plan, b);
}

namespace {

// Work for one part of a call (parallel_units): scratch, and the column of
// the permutation table when correlated rounding uses one.
Work make_work(const DynamiqFormat& f, const DqRounding& rd) {
  Work ws(f.S, f.S / f.s);
  if (rd.correlated && rd.perm.n >= 3 && rd.perm.n <= uint32_t(kPermTableMaxN))
    ws.col8 = perm_table_column8(int(rd.perm.n), int(rd.perm.rank));
  return ws;
}

// Wire bytes of positions [b.w0, w): where the part starting at w reads or writes.
inline int64_t wire_from(const Plan& plan, const Block& b, int64_t w) {
  return plan.wire_offset[size_t(w)] - plan.wire_offset[size_t(b.w0)];
}

}  // namespace

size_t DynamiqCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                              uint8_t* out) const {
  const size_t bytes = check_block(plan, b);
  const DqRounding rd = make_dynamiq_rounding(rng);
  const Ctx cx{p_.fmt, tables_.view(), p_.stochastic_group_scales, tables_};
  const int64_t ahead = prefetch_ahead(plan);
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws = make_work(p_.fmt, rd);
    for (int64_t u0, u1; runs.next(u0, u1);) {
      uint8_t* o = out + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int64_t src = plan.src_unit(w);
        if (w + ahead < u1) prefetch_unit(x, plan, w + ahead);
        load_unit(x, plan, w, ws.tile.data());
        const int bits = plan.bits[size_t(src)];
        dispatch_width(bits, [&](auto B) { encode_sg<decltype(B)::value>(cx, rd, src, ws, o); });
        o += dynamiq_sg_bytes(bits, p_.fmt);
      }
    }
  });
  return bytes;
}

void DynamiqCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan,
                              const Block& b, const Output& y) const {
  check_message_size(in_bytes, check_block(plan, b), "dynamiq");
  const Ctx cx{p_.fmt, tables_.view(), p_.stochastic_group_scales, tables_};
  const int64_t ahead = prefetch_ahead(plan);
  Local yl;  // the output bucket, for prefetching the units about to be written
  yl.bucket = y.bucket;
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws(p_.fmt.S, p_.fmt.S / p_.fmt.s);
    for (int64_t u0, u1; runs.next(u0, u1);) {
      const uint8_t* p = in + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int bits = plan.bits[size_t(plan.src_unit(w))];
        if (w + ahead < u1) prefetch_unit(yl, plan, w + ahead);
        dispatch_width(
            bits, [&](auto B) { decode_sg<decltype(B)::value>(cx, p, nullptr, ws, ws.tile.data()); });
        store_unit(y, plan, w, ws.tile.data());
        p += dynamiq_sg_bytes(bits, p_.fmt);
      }
    }
  });
}

void DynamiqCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                         const Plan& plan, const Block& b, float* acc) const {
  check_message_size(in_bytes, check_block(plan, b), "dynamiq");
  const Ctx cx{p_.fmt, tables_.view(), p_.stochastic_group_scales, tables_};
  const int64_t ahead = prefetch_ahead(plan);
  const int64_t U = plan.unit;
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws(p_.fmt.S, p_.fmt.S / p_.fmt.s);
    for (int64_t u0, u1; runs.next(u0, u1);) {
      const uint8_t* p = in + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int64_t src = plan.src_unit(w);
        const int bits = plan.bits[size_t(src)];
        if (w + ahead < u1) prefetch_unit(x, plan, w + ahead);
        load_unit(x, plan, w, ws.tile.data());  // before writing: x may alias acc
        float* dst = acc + (w - b.w0) * U;
        dispatch_width(
            bits, [&](auto B) { decode_sg<decltype(B)::value>(cx, p, ws.tile.data(), ws, dst); });
        zero_padding(plan, src, dst);
        p += dynamiq_sg_bytes(bits, p_.fmt);
      }
    }
  });
}

size_t DynamiqCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes,
                                                      const Local& x, const Plan& plan,
                                                      const Block& b, const RngCtx& rng,
                                                      uint8_t* out) const {
  const size_t bytes = check_block(plan, b);
  check_message_size(in_bytes, bytes, "dynamiq");
  const DqRounding rd = make_dynamiq_rounding(rng);
  const Ctx cx{p_.fmt, tables_.view(), p_.stochastic_group_scales, tables_};
  const int64_t ahead = prefetch_ahead(plan);
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws = make_work(p_.fmt, rd);
    std::vector<float> local(size_t(p_.fmt.S));
    for (int64_t u0, u1; runs.next(u0, u1);) {
      const uint8_t* p = in + wire_from(plan, b, u0);
      uint8_t* o = out + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int64_t src = plan.src_unit(w);
        const int bits = plan.bits[size_t(src)];
        const int64_t sg = dynamiq_sg_bytes(bits, p_.fmt);
        // the unit `ahead` positions on, in two halves: a burst of 16 line
        // prefetches into a 4 KiB page not in the TLB stalled the loads behind
        // it (perf; the stall went away on 2 MiB pages). 0.96-0.97 against
        // 0.99-1.02 ns/element, fp32 mix5 at 64 MiB.
        const bool pf = w + ahead < u1;
        if (pf) prefetch_unit(x, plan, w + ahead, 0, 2);
        load_unit(x, plan, w, local.data());
        dispatch_width(bits, [&](auto B) {
          constexpr int BB = decltype(B)::value;
          decode_sg<BB>(cx, p, local.data(), ws, ws.tile.data());
          zero_padding(plan, src, ws.tile.data());
          if (pf) prefetch_unit(x, plan, w + ahead, 1, 2);
          encode_sg<BB>(cx, rd, src, ws, o);
        });
        p += sg;
        o += sg;
      }
    }
  });
  return bytes;
}

void dynamiq_fill_words(const RngKey& key, uint64_t call0, uint32_t purpose, uint32_t who, int S,
                        uint32_t* words) {
  DQ_CHECK(S % 4 == 0, "dynamiq_fill_words: S must be a multiple of 4");
  fill_words(key, call0, purpose, who, S, words);
}

}  // namespace dynamiq
