// The AVX2 kernels of the DynamiQ CPU codec (dynamiq_cpu.h), compiled in the
// x86-64-v3 build. Each is bit-identical to the portable kernel it replaces
// (dynamiq_cpu_scalar.cc) and to the per-element math of dynamiq_math.h.
// Timings in the comments are from the Zen 3 guest the kernels were tuned on.
#include "kernels/dynamiq/dynamiq_cpu.h"

#if defined(__AVX2__)

#include <type_traits>

#include "kernels/base/philox_simd.h"

namespace dynamiq::dq_cpu::avx2 {
namespace {

// ---- building blocks (bit-identical to the scalar functions they mirror) ----

// high 32 bits of a * b per 32-bit lane (perm_mulhi, philox mulhilo)
inline __m256i mulhi_epu32(__m256i a, __m256i b) {
  const __m256i pe = _mm256_mul_epu32(a, b);
  const __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
  return _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
}

// The largest of the 8 lanes (unsigned).
inline uint32_t reduce_max_epu32(__m256i m) {
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  return uint32_t(_mm_cvtsi128_si32(h));
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
inline __m256i mix32_tail(__m256i x) {
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x7feb352du)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x846ca68bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return x;
}

// perm_mix32 on 8 lanes
inline __m256i mix32(__m256i x) {
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
inline void swap_or_not(uint32_t n, uint32_t rank, const __m256i* w, __m256i* xo) {
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
      const __m256i h = mix32_tail(_mm256_xor_si256(u[v], cj));
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
        bit = mix32(
            _mm256_add_epi32(h, _mm256_mullo_epi32(_mm256_set1_epi32(int(0x85ebca6bu)), hi)));
      }
      x[v] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(x[v]), _mm256_castsi256_ps(xp),
                                                  _mm256_castsi256_ps(bit)));  // xp where bit
    }
  }
  for (int v = 0; v < NV; ++v) xo[v] = x[v];
}

// The value passes of scalar::encode_values (dq_sign, dq_normalise,
// dq_bracket<B>, dq_frac, dq_round_up, dq_code<B>) and the planar packing in
// one AVX2 loop, for B in {2, 4, 8} and nb = S*B/8 a multiple of 32: each
// iteration makes 32 code bytes from the P = 8/B vectors of 8 elements that
// share them. gv[i >> rs]: 1/normaliser of the 8 elements from i (rs = 3 or
// 4: one value per 8- or 16-element run; s a multiple of 8, see per_run in
// dynamiq_codec.cc). w: the S/2 32-bit words of the S/8 value calls, not
// expanded (fill_words: call c's words at w[4c, 4c + 4); the vector of the 8
// elements of octet c takes them broadcast to both 128-bit halves, the low
// half rounding with their low 16 bits: dq_octet_word), read when kStoch; pi (strata)
// read when kCorr. recp: DynamiqTables::cell_rec of width B (B = 8's bracket
// search reads the cell's 16-byte record and cell[c] with plain loads: on the
// Zen 3 guest 8-wide gathers cost more than 8 loads and inserts).
//
// dq_round_up is evaluated scaled by K = 1/gscale (a power of two): with
// u = w >> gshift (an integer, gamma = u / K), the rounding compares
// K (pi + gamma) = pi K + u (or K n - (pi K + u) for a negative value) with
// p (n K). Bit-identical to the unscaled comparisons: pi K + u and
// K n - (pi K + u) are integers below 2^24 (exact, as pi + gamma and
// n - (pi + gamma) are), and p (n K) = K RN(p n) exactly unless p n is
// subnormal, where both sides round down (pi + gamma and n - (pi + gamma) are
// >= 2^-17 there).
template <int B, bool kStoch, bool kCorr>
void encode_values_t(const DqLevels& lv, const uint32_t* __restrict recp, const DqRounding& rd, int S,
                     const float* __restrict t, const float* __restrict gv, int rs,
                     const float* __restrict pi, const uint32_t* __restrict w, uint8_t* __restrict out) {
  constexpr int P = 8 / B;
  const int nb = S / P;
  const __m256i mid = _mm256_set1_epi32(0x8000), himask = _mm256_set1_epi32(int(0xffff0000u));
  const __m256i u16shift = _mm256_setr_epi32(16, 16, 16, 16, 0, 0, 0, 0);
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

  auto code8 = [&](int i) -> __m256i {
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
    // dq_round_up, scaled by K = 1/gscale (exact: see above)
    __m256 vK = halfK;
    if constexpr (kStoch) {
      // octet i/8's call: words w[i/2 .. i/2 + 4) in both halves
      const __m256i wc = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i / 2)));
      const __m256i wv = _mm256_or_si256(_mm256_and_si256(_mm256_sllv_epi32(wc, u16shift), himask), mid);
      vK = _mm256_cvtepi32_ps(_mm256_srl_epi32(wv, gshift));
    }
    if constexpr (kCorr) vK = _mm256_fmadd_ps(_mm256_loadu_ps(pi + i), Kv, vK);
    const __m256 side = _mm256_blendv_ps(vK, _mm256_sub_ps(nK, vK), negm);
    const __m256 up = _mm256_cmp_ps(side, _mm256_mul_ps(p, nK), _CMP_LT_OQ);
    j = _mm256_sub_epi32(j, _mm256_castps_si256(up));
    return _mm256_or_si256(j, _mm256_and_si256(_mm256_castps_si256(negm), signbit));
  };

  // the P vectors whose codes share the code bytes [k, k + 8)
  auto codeq = [&](int k) -> __m256i {
    if constexpr (P == 1) {
      return code8(k);
    } else if constexpr (P == 2) {
      return _mm256_or_si256(code8(k), _mm256_slli_epi32(code8(k + nb), B));
    } else {
      static_assert(P == 4, "widths 2, 4, 8");
      const __m256i c01 = _mm256_or_si256(code8(k), _mm256_slli_epi32(code8(k + nb), B));
      const __m256i c23 = _mm256_or_si256(_mm256_slli_epi32(code8(k + 2 * nb), 2 * B),
                                          _mm256_slli_epi32(code8(k + 3 * nb), 3 * B));
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

}  // namespace

template <int B>
void encode_values(const DqLevels& lv, const uint32_t* __restrict recp, const DqRounding& rd, int S,
                   const float* __restrict t, const float* __restrict gv, int rs,
                   const float* __restrict pi, const uint32_t* __restrict w, uint8_t* __restrict out) {
  auto go = [&](auto stoch, auto corr) {
    encode_values_t<B, decltype(stoch)::value, decltype(corr)::value>(lv, recp, rd, S, t, gv, rs, pi,
                                                                      w, out);
  };
  using T = std::true_type;
  using F = std::false_type;
  if (rd.stochastic)
    pi ? go(T(), T()) : go(T(), F());
  else
    pi ? go(F(), T()) : go(F(), F());
}

void fill_words(const RngKey& key, uint64_t base, uint32_t purpose, uint32_t who, int S,
                uint32_t* __restrict words) {
  philox4x32_10_x32_avx2(uint32_t(base), purpose, who, uint32_t(base >> 32), key.k0, key.k1, S / 4,
                         words);
}

void expand_u16_words(int S, uint32_t* __restrict w) {
  // octet c: its call's 4 words in both halves, the low half of the vector
  // taking their low 16 bits; from the last octet down (scalar::expand_u16_words)
  const __m256i mid = _mm256_set1_epi32(0x8000), himask = _mm256_set1_epi32(int(0xffff0000u));
  const __m256i u16shift = _mm256_setr_epi32(16, 16, 16, 16, 0, 0, 0, 0);
  for (int c = S / 8 - 1; c >= 0; --c) {
    const __m256i wc = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 4 * c)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + 8 * c),
                        _mm256_or_si256(_mm256_and_si256(_mm256_sllv_epi32(wc, u16shift), himask), mid));
  }
}

void fill_strata(const PermParams& pp, const uint8_t* col8, int S, const uint32_t* __restrict sw,
                 float* __restrict pi) {
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
        swap_or_not<true, NV>(pp.n, pp.rank, w, x);
      else
        swap_or_not<false, NV>(pp.n, pp.rank, w, x);
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(pi + i + 8 * v, _mm256_cvtepi32_ps(x[v]));
    }
    for (; i < S; i += 8) {
      __m256i w[1], x[1];
      w[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sw + i));
      if (pp.n <= 32u)
        swap_or_not<true, 1>(pp.n, pp.rank, w, x);
      else
        swap_or_not<false, 1>(pp.n, pp.rank, w, x);
      _mm256_storeu_ps(pi + i, _mm256_cvtepi32_ps(x[0]));
    }
  }
}

void broadcast_groups(const float* __restrict v, int G, int s, float* __restrict out) {
  for (int k = 0; k < G; ++k) {
    const __m256 b = _mm256_broadcast_ss(v + k);
    for (int i = 0; i < s; i += 8) _mm256_storeu_ps(out + k * s + i, b);
  }
}

// Group maxima of |t| on the bit patterns (s a multiple of 8); returns the overall max.
uint32_t group_max(const float* __restrict t, int G, int s, float* __restrict gmax) {
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  __m256i all = _mm256_setzero_si256();
  for (int k = 0; k < G; ++k) {
    __m256i m = _mm256_setzero_si256();
    for (int i = 0; i < s; i += 8) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + k * s + i));
      m = _mm256_max_epu32(m, _mm256_and_si256(v, absmask));
    }
    all = _mm256_max_epu32(all, m);
    gmax[k] = bits_f32(reduce_max_epu32(m));
  }
  return reduce_max_epu32(all);
}

// dq_group_scale_up for groups [0, G8) (G8 a multiple of 8): codes into rk,
// 1/normaliser into ik. rrec: DynamiqTables::r255_rec.
void group_scales_up(const float* __restrict gmax, float Msg, const float* __restrict rrec, int G8,
                     uint32_t* __restrict rk, float* __restrict ik) {
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

template void encode_values<2>(const DqLevels&, const uint32_t*, const DqRounding&, int, const float*,
                               const float*, int, const float*, const uint32_t*, uint8_t*);
template void encode_values<4>(const DqLevels&, const uint32_t*, const DqRounding&, int, const float*,
                               const float*, int, const float*, const uint32_t*, uint8_t*);
template void encode_values<8>(const DqLevels&, const uint32_t*, const DqRounding&, int, const float*,
                               const float*, int, const float*, const uint32_t*, uint8_t*);

}  // namespace dynamiq::dq_cpu::avx2

#endif  // __AVX2__
