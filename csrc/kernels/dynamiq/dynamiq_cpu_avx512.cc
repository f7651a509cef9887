// The AVX-512 (F, BW, DQ, VL) kernels of the DynamiQ CPU codec
// (dynamiq_cpu.h): the only file compiled with -mavx512* (CMakeLists.txt), run
// when cpu_isa() is kAvx512. Each is bit-identical to its AVX2 twin and to the
// shared math (tests/cpp/test_dynamiq_fastpath.cc runs under both ISAs).
// Timings in the comments are from the Zen 4 guest the kernels were tuned on.
//
// Everything but the entry points (namespace dq_cpu::avx512) has internal
// linkage, and nothing here calls an inline function of a shared header: such
// a function compiled with these flags could become the one copy the linker
// keeps for the whole library, which must still run on AVX2-only CPUs.
#include "kernels/dynamiq/dynamiq_cpu.h"

#if defined(DQ_HAVE_AVX512)
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512DQ__) || !defined(__AVX512VL__)
#error "dynamiq_cpu_avx512.cc needs -mavx512f -mavx512bw -mavx512dq -mavx512vl (CMakeLists.txt)"
#endif

#include <type_traits>

#include "kernels/base/philox_simd.h"

namespace dynamiq::dq_cpu::avx512 {
namespace {

// float_bits.h's f32_bits / bits_f32, local (see the top of the file).
inline uint32_t bits_of(float f) { return __builtin_bit_cast(uint32_t, f); }
inline float float_of(uint32_t u) { return __builtin_bit_cast(float, u); }

inline __m512i mulhi_epu32(__m512i a, __m512i b) {
  const __m512i pe = _mm512_mul_epu32(a, b);
  const __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(b, 32));
  return _mm512_mask_mov_epi32(_mm512_srli_epi64(pe, 32), __mmask16(0xAAAA), po);
}

inline __m512i mix32_tail(__m512i x) {
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x7feb352du)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x846ca68bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  return x;
}

// avx2::swap_or_not on 16 lanes (the swap decision as a mask register)
template <bool kSmall, int NV>
inline void swap_or_not(uint32_t n, uint32_t rank, const __m512i* w, __m512i* xo) {
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
      const __m512i h = mix32_tail(_mm512_xor_si512(u[v], cj));
      const __m512i k = mulhi_epu32(h, N);
      const __m512i xp = _mm512_sub_epi32(_mm512_mask_add_epi32(k, _mm512_cmpgt_epi32_mask(x[v], k), k, N), x[v]);
      const __m512i hi = _mm512_max_epi32(x[v], xp);
      __mmask16 bit;
      if constexpr (kSmall) {
        const __m512i g = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x2545f491u)));
        bit = _mm512_movepi32_mask(_mm512_sllv_epi32(g, _mm512_andnot_si512(hi, _mm512_set1_epi32(31))));
      } else {
        __m512i m = _mm512_add_epi32(h, _mm512_mullo_epi32(_mm512_set1_epi32(int(0x85ebca6bu)), hi));
        m = _mm512_xor_si512(m, _mm512_srli_epi32(m, 16));
        bit = _mm512_movepi32_mask(mix32_tail(m));
      }
      x[v] = _mm512_mask_mov_epi32(x[v], bit, xp);
    }
  }
  for (int v = 0; v < NV; ++v) xo[v] = x[v];
}

// avx2 load_records8 on 16 lanes: sixteen 16-byte records base + 4 idx[k],
// transposed (out[f] lane k = field f of record k). 16 plain loads and a 4x4
// transpose per 128-bit lane; on the Zen 4 guest cheaper than the 16-lane
// gathers of the same fields.
inline void load_records16(const float* base, const int32_t* idx, __m512 out[4]) {
  auto row = [&](int q) {  // records q, q + 4, q + 8, q + 12
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

// avx2::encode_values on 16 lanes with mask registers, for nb = S*B/8 a
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
// loop carries no run-time branches.
template <int B, bool kStoch, bool kCorr, bool kReg4>
void encode_values_t(const DqLevels& lv, const uint32_t* __restrict recp,
                     const DynamiqTables::Width4Regs& w4, const DqRounding& rd,
                     int S, const float* __restrict t,
                     const float* __restrict g16, const float* __restrict pi,
                     const uint32_t* __restrict w, uint8_t* __restrict out) {
  // g16: the 1/normaliser of each run of 16 elements (S/16 values: s is a
  // multiple of 16; indexing per run, not i / s, keeps an integer division out
  // of the loop); w: the S/2 words of the SG's S/8 value calls, not expanded
  // (call c's words at w[4c, 4c + 4): the 16 elements of octets c, c + 1 take
  // w[4c, 4c + 8), each octet's 4 words twice, the first 4 lanes of an octet
  // rounding with their low 16 bits: dq_octet_word)
  const __m512i mid = _mm512_set1_epi32(0x8000), himask = _mm512_set1_epi32(int(0xffff0000u));
  const __m512i octet_words = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7);
  const __m512i u16shift = _mm512_setr_epi32(16, 16, 16, 16, 0, 0, 0, 0, 16, 16, 16, 16, 0, 0, 0, 0);
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
      for (int k = 1; k < 7; ++k) lb[k - 1] = _mm512_set1_epi32(int32_t(bits_of(lv.level[k])));
    }
  }
  // cells: width 8's table search, width 4's register tables (the last cell below 1.0)
  const __m512i cbase = _mm512_set1_epi32(int32_t(lv.cell_base));
  const __m512i cshift = _mm512_set1_epi32(lv.cell_shift);
  const __m512i clast = _mm512_set1_epi32(kReg4 ? w4.last_cell : lv.ncells - 1);
  const float* __restrict rec = reinterpret_cast<const float*>(recp);

  auto code16 = [&](int i) -> __m512i {
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
      const __m512i wc = _mm512_permutexvar_epi32(
          octet_words, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i / 2))));
      // (wc << shift) & himask | mid
      const __m512i wv = _mm512_ternarylogic_epi32(_mm512_sllv_epi32(wc, u16shift), himask, mid, 0xEA);
      vK = _mm512_cvtepi32_ps(_mm512_srlv_epi32(wv, gshift));
    }
    if constexpr (kCorr) vK = _mm512_fmadd_ps(_mm512_loadu_ps(pi + i), Kv, vK);  // exact
    const __m512 side = _mm512_mask_sub_ps(vK, negm, nK, vK);      // negative: K n - K v
    const __mmask16 up = _mm512_cmp_ps_mask(side, _mm512_mul_ps(p, nK), _CMP_LT_OQ);
    j = _mm512_mask_add_epi32(j, up, j, one);
    return _mm512_mask_or_epi32(j, negm, j, signbit);
  };

  auto put = [&](int k, __m512i c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm512_cvtepi32_epi8(c));
  };
  auto code = [&](int i, int shift) { return _mm512_slli_epi32(code16(i), shift); };
  if constexpr (P == 1) {
    for (int k = 0; k < nb; k += 16) put(k, code16(k));
  } else if constexpr (P == 2) {
    for (int k = 0; k < nb; k += 16) put(k, _mm512_or_si512(code16(k), code(k + nb, B)));
  } else {
    static_assert(P == 4, "widths 2, 4, 8");
    for (int k = 0; k < nb; k += 16) {
      const __m512i c01 = _mm512_or_si512(code16(k), code(k + nb, B));
      const __m512i c23 = _mm512_or_si512(code(k + 2 * nb, 2 * B), code(k + 3 * nb, 3 * B));
      put(k, _mm512_or_si512(c01, c23));
    }
  }
}

}  // namespace

void fill_words(const RngKey& key, uint64_t base, uint32_t purpose, uint32_t who, int S,
                uint32_t* __restrict words) {
  philox4x32_10_x32_avx512(uint32_t(base), purpose, who, uint32_t(base >> 32), key.k0, key.k1, S / 4,
                           words);
}

// avx2::fill_strata on 16 lanes (S a multiple of 16)
void fill_strata(const PermParams& pp, const uint8_t* col8, int S,
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
      const __m512i m = mulhi_epu32(_mm512_loadu_si512(sw + i), nf);  // < n!
      _mm512_storeu_ps(pi + i, _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(t0, m, t1)));
    }
  } else if (pp.n <= uint32_t(kPermTableMaxN)) {
    const __m512i nf = _mm512_set1_epi32(int(pp.nfact));
    const __m512i lo = _mm512_set1_epi32(0xff);
    for (int i = 0; i < S; i += 16) {
      const __m512i m = mulhi_epu32(_mm512_loadu_si512(sw + i), nf);
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
        swap_or_not<true, NV>(pp.n, pp.rank, w, x);
      else
        swap_or_not<false, NV>(pp.n, pp.rank, w, x);
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(pi + i + 16 * v, _mm512_cvtepi32_ps(x[v]));
    }
    for (; i < S; i += 16) {
      __m512i w[1], x[1];
      w[0] = _mm512_loadu_si512(sw + i);
      if (pp.n <= 32u)
        swap_or_not<true, 1>(pp.n, pp.rank, w, x);
      else
        swap_or_not<false, 1>(pp.n, pp.rank, w, x);
      _mm512_storeu_ps(pi + i, _mm512_cvtepi32_ps(x[0]));
    }
  }
}

template <int B>
void encode_values(const DqLevels& lv, const uint32_t* __restrict recp,
                   const DynamiqTables::Width4Regs& w4, const DqRounding& rd,
                   int S, const float* __restrict t, const float* __restrict g16,
                   const float* __restrict pi, const uint32_t* __restrict w,
                   uint8_t* __restrict out) {
  auto go = [&](auto stoch, auto corr) {
    constexpr bool kS = decltype(stoch)::value, kC = decltype(corr)::value;
    if constexpr (B == 4) {
      if (w4.ok) {
        encode_values_t<B, kS, kC, true>(lv, recp, w4, rd, S, t, g16, pi, w, out);
        return;
      }
    }
    encode_values_t<B, kS, kC, false>(lv, recp, w4, rd, S, t, g16, pi, w, out);
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

// avx2::decode_values on 16 lanes (nb a multiple of 16, s a multiple of 16).
template <int B>
void decode_values(const float* __restrict dec, const uint8_t* __restrict codes,
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

// Group maxima of |t| for s = 16 and G a multiple of 16: sixteen groups (one
// vector each) reduced together by a 4-level transposing max tree (each level
// halves every segment with two vpermt2d and a max), so lane k of the result
// is group k's maximum. Returns the overall max (bit patterns, as avx2::group_max).
uint32_t group_max16(const float* __restrict t, int G, float* __restrict gmax) {
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

// avx2::group_scales_up on 16 groups per iteration (G16 a multiple of 16).
void group_scales_up(const float* __restrict gmax, float Msg,
                     const float* __restrict rrec, int G16,
                     uint32_t* __restrict rk, float* __restrict ik) {
  const int32_t mb = int32_t(bits_of(Msg));
  const __m512 Mq = _mm512_set1_ps(float_of(mb > 0 ? uint32_t(mb) : 0x3f800000u));
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
    // as avx2::group_scales_up)
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

template void encode_values<2>(const DqLevels&, const uint32_t*, const DynamiqTables::Width4Regs&,
                               const DqRounding&, int, const float*, const float*, const float*,
                               const uint32_t*, uint8_t*);
template void encode_values<4>(const DqLevels&, const uint32_t*, const DynamiqTables::Width4Regs&,
                               const DqRounding&, int, const float*, const float*, const float*,
                               const uint32_t*, uint8_t*);
template void encode_values<8>(const DqLevels&, const uint32_t*, const DynamiqTables::Width4Regs&,
                               const DqRounding&, int, const float*, const float*, const float*,
                               const uint32_t*, uint8_t*);
template void decode_values<2>(const float*, const uint8_t*, int, const float*, const float*, float*);
template void decode_values<4>(const float*, const uint8_t*, int, const float*, const float*, float*);
template void decode_values<8>(const float*, const uint8_t*, int, const float*, const float*, float*);

}  // namespace dynamiq::dq_cpu::avx512

#endif  // DQ_HAVE_AVX512
