// The portable kernels of the DynamiQ CPU codec (dynamiq_cpu.h): plain loops
// over the shared per-element math of dynamiq_math.h, written so that gcc
// vectorises them (one pass per step). They are all a build without AVX2 runs
// (aarch64, DYNAMIQ_CPU_ARCH empty), and the fallback of the vector kernels
// for the shapes those skip.
#include <cmath>
#include <cstring>

#include "kernels/dynamiq/dynamiq_cpu.h"

namespace dynamiq::dq_cpu::scalar {

void fill_words(const RngKey& key, uint64_t base, uint32_t purpose, uint32_t who, int S,
                uint32_t* __restrict words) {
  const int q = S / 4;
  const uint32_t hi = uint32_t(base >> 32);
  const uint32_t lo = uint32_t(base);
  const bool no_wrap = uint64_t(lo) + uint64_t(q) <= (uint64_t(1) << 32);
  for (int k = 0; k < q; ++k) {
    const Philox4x32 r = no_wrap ? philox4x32_10(lo + uint32_t(k), purpose, who, hi, key.k0, key.k1)
                                 : dq_draw(key, base + uint64_t(k), purpose, who);
    for (int j = 0; j < 4; ++j) words[4 * k + j] = r.v[j];
  }
}

void expand_u16_words(int S, uint32_t* __restrict w) {
  // octet c reads words [4c, 4c + 4) and writes [8c, 8c + 8): from the last
  // octet down, no octet overwrites words a later one still reads
  for (int c = S / 8 - 1; c >= 0; --c) {
    uint32_t v[4];
    for (int j = 0; j < 4; ++j) v[j] = w[4 * c + j];
    for (int j = 0; j < 4; ++j) {
      w[8 * c + j] = dq_u16_word(v[j] & 0xffffu);
      w[8 * c + 4 + j] = dq_u16_word(v[j] >> 16);
    }
  }
}

// One loop per permutation kind, so each is a simple vectorisable loop.
void fill_strata(const PermParams& pp, int S, const uint32_t* __restrict sw, float* __restrict pi) {
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

void broadcast_groups(const float* __restrict v, int G, int s, float* __restrict out) {
  for (int k = 0; k < G; ++k)
    for (int i = 0; i < s; ++i) out[k * s + i] = v[k];
}

uint32_t group_max(const float* __restrict t, int G, int s, float* __restrict gmax) {
  const uint32_t* __restrict tb = reinterpret_cast<const uint32_t*>(t);
  uint32_t mbits = 0;
  for (int k = 0; k < G; ++k) {
    uint32_t m = 0;
    for (int i = 0; i < s; ++i) {
      const uint32_t v = tb[k * s + i] & 0x7fffffffu;
      m = v > m ? v : m;
    }
    gmax[k] = bits_f32(m);
    mbits = m > mbits ? m : mbits;
  }
  return mbits;
}

void group_scales_up(const float* __restrict gmax, float Msg, const float* __restrict r255, int k0,
                     int G, uint32_t* __restrict rk, float* __restrict ik) {
  for (int k = k0; k < G; ++k) {
    const DqGroupScale gs = dq_group_scale_up(gmax[k], Msg, r255);
    rk[k] = gs.r;
    ik[k] = gs.inv;
  }
}

void group_scales_stochastic(const float* __restrict gmax, float Msg, const float* __restrict r255,
                             const DqRounding& rd, int64_t src, int G, uint8_t* __restrict out,
                             float* __restrict ginv) {
  uint32_t gw[4] = {0, 0, 0, 0};
  for (int k = 0; k < G; ++k) {
    if (k % 4 == 0) {
      const Philox4x32 r = dq_draw(rd.key, uint64_t(src) * uint64_t((G + 3) / 4) + uint64_t(k / 4),
                                   kPurposeGroupScale, rd.rank);
      for (int j = 0; j < 4; ++j) gw[j] = r.v[j];
    }
    const DqGroupScale gs = dq_group_scale_stochastic(gmax[k], Msg, r255, gw[k % 4]);
    out[k] = gs.r;
    ginv[k] = gs.inv;
  }
}

void flat_scales(const float* __restrict gmax, int G, bool bad, uint8_t* __restrict out,
                 float* __restrict ginv) {
  for (int k = 0; k < G; ++k) {
    uint16_t hb;
    DqGroupScale gs = dq_group_scale_flat(gmax[k], hb);
    if (bad) {
      hb = 0x7fc0u;
      gs.inv = 0.0f;
    }
    put_bf16(out + 2 * k, hb);
    ginv[k] = gs.inv;
  }
}

namespace {

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

}  // namespace

template <int B>
void encode_values(const DqLevels& lv, const DqRounding& rd, int S, const float* __restrict t,
                   const float* __restrict inv_e, const float* __restrict pi,
                   const uint32_t* __restrict w, const Passes& ps, uint8_t* __restrict out) {
  // codes: the steps of dq_encode_value as separate passes (each vectorises)
  uint32_t* __restrict c = ps.c;
  const DqRounding r = rd;
  if constexpr (B == 1) {
    for (int i = 0; i < S; ++i) c[i] = dq_encode_sign(t[i], inv_e[i], pi[i], w[i], r);
  } else {
    float* __restrict a = ps.a;
    float* __restrict pr = ps.p;
    int32_t* __restrict jj = ps.j;
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
  for (int k = 0; k < nb; ++k) {
    uint32_t byte = 0;
    for (int j = 0; j < P; ++j) byte |= c[k + j * nb] << (j * B);
    out[k] = uint8_t(byte);
  }
}

template <int B>
void decode_values(const float* __restrict dec, const uint8_t* __restrict codes, int S,
                   const float* __restrict sc, const float* __restrict base, float* __restrict tile) {
  constexpr int P = 8 / B;
  constexpr uint32_t mask = (1u << B) - 1u;
  const int nb = S / P;
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

#define DQ_INSTANTIATE(B)                                                                           \
  template void encode_values<B>(const DqLevels&, const DqRounding&, int, const float*, const float*, \
                                 const float*, const uint32_t*, const Passes&, uint8_t*);           \
  template void decode_values<B>(const float*, const uint8_t*, int, const float*, const float*, float*);
DQ_INSTANTIATE(1)
DQ_INSTANTIATE(2)
DQ_INSTANTIATE(4)
DQ_INSTANTIATE(8)
#undef DQ_INSTANTIATE

void encode_bf16(const float* __restrict t, int S, uint16_t* __restrict scratch, uint8_t* __restrict out) {
  for (int i = 0; i < S; ++i) scratch[i] = f32_to_bf16(t[i]);
  std::memcpy(out, scratch, size_t(2 * S));  // little-endian host
}

void decode_bf16(const uint8_t* __restrict in, int S, const float* __restrict base, float* __restrict tile) {
  for (int i = 0; i < S; ++i) {
    const float v = bf16_to_f32(get_bf16(in + 2 * i));
    tile[i] = base ? base[i] + v : v;
  }
}

}  // namespace dynamiq::dq_cpu::scalar
