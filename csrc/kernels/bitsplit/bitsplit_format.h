// Bit-split group quantisation (FlashCommunication V2, "Bit Splitting" and
// "Spike Reserving"): the wire format and the per-group math, as
// __host__ __device__ functions shared by the CPU codec (bitsplit_codec.cc)
// and the CUDA kernels (cuda/bitsplit_kernels.cu), so both write the same bytes.
//
// ---- Quantisation ---------------------------------------------------------------
// A bucket is cut into groups of G elements in natural order (G a multiple of
// 32 in [32, 256]; the bucket's last group may be partial). A group is
// quantised asymmetrically to b bits (2..8), L = 2^b - 1:
//     value(q) = fmaf(q, scale, zero),  q in [0, L].
// Encoding picks a small stored scale and a zero with
//     value(0) = zero <= lo   and   value(L) >= hi,
// (both checked with the decoder's own float arithmetic), so every value of
// [lo, hi] lies inside the grid: stochastic rounding q = floor(t + u),
// t = (x - zero) / scale, u a 16-bit Philox uniform (bitsplit_uniforms), is
// unbiased to 2^-16 of a step; nearest rounding is q = rint(t). [lo, hi] is
// the group's [min, max], or with spike reserving the [min, max] of the group
// without its spikes (its second smallest and second largest values).
//
// Spike reserving: the group's first minimum and first maximum element are
// sent as values in the *bucket's* dtype (float32: 4 bytes, bf16/fp16: 2
// bytes) with uint8 in-group indices, and restored after dequantisation; their
// code slots carry 0. Keeping them in the bucket dtype (rather than the
// paper's bf16 for every dtype) makes "the spikes come back exactly" true for
// float32 buckets too: a float32 spike rounded to bf16 would be off by up to
// 2^-9 of the group's largest value, more than an INT8 step. A spike that is
// a float32 partial sum (middle hops) is rounded to the bucket dtype, as the
// identity codec rounds every hop.
//
// Scales (per group, 4 or 2 bytes, as the paper's table 4):
//  - bf16 (default): uint16 bf16 scale, then uint16 bf16 zero.
//    zero = lo rounded down to bf16, scale = (hi - zero) / L rounded up to bf16
//    (then raised by one bf16 ulp if value(L) < hi after the float roundings).
//  - integer log scales: one uint16 word, bits 0..8 = k (signed, -256..255),
//    bits 9..15 = z (signed, -64..63):
//        scale = 2^(k / 10)   (theta = 10, decoded exactly: table * 2^floor(k/10))
//        zero  = z * (L * scale / 64)
//    k is the smallest value >= a lower bound for which a z exists with
//    zero <= lo and value(L) >= hi, i.e. k = ceil(log2(scale) * 10), not the
//    paper's floor: floor would clip the top ~7% of each group's range.
//    9 bits of k span scales 2^-25.6 .. 2^25.5 (gradients are far smaller
//    than the activations the paper's 8-bit integer covers); 7 bits of z place
//    the zero within 1/64 of the range for groups that straddle 0 (gradient
//    groups do). The zero lies in [-L*scale, 63/64*L*scale], so a group far
//    from 0 (a nonzero constant, say) gets scale >= hi / (127/64 L): coarser,
//    never out of range.
//
// ---- Bit splitting: planes ----------------------------------------------------------
// A b-bit code is split into planes of regular widths, most significant first:
//     b:       2    3     4    5     6     7       8
//     planes:  2    2+1   4    4+1   4+2   4+2+1   8
// q = sum_p field_p << shift_p, shift_p = total width of the planes after p.
// Plane p holds field_p of every element slot of the block: slot i (element
// e0 + i of the block, including the code slots of a partial last group) is
// at plane bit i*w_p, i.e. byte (i*w_p)/8, bits (i*w_p)%8 .. +w_p-1, least
// significant first. A group's segment of a plane is G*w_p/8 bytes, a multiple
// of 4, so every plane access is an aligned 32-bit word.
//
// ---- Block message (ng groups, all offsets from the message start) ---------------------
//   plane 0          ng*G*w_0/8 bytes
//   plane 1, 2       ng*G*w_p/8 bytes each (3, 5, 6, 7 bits)
//   spike values     (spikes on) ng*2 values of the bucket dtype, little-endian:
//                    group g's min at index 2g, its max at 2g+1
//   scales           ng*4 bytes (bf16: group g at 4g: scale, zero) or
//                    ng*2 bytes (log: group g's word at 2g)
//   spike indices    (spikes on) ng*2 uint8: group g's argmin at 2g, argmax at 2g+1
// Every section starts at a multiple of its element size. Total:
//   ng * (G*b/8 + (log ? 2 : 4) + (spikes ? 2*(dtype_size + 1) : 0)) bytes.
#pragma once

#include "kernels/base/bytes.h"
#include "kernels/base/common.h"
#include "kernels/base/float_bits.h"
#include "kernels/base/philox.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the bit-split wire format is little-endian; this host is not"
#endif

namespace dynamiq {

constexpr int kBitsplitMinGroup = 32;
constexpr int kBitsplitMaxGroup = 256;  // uint8 in-group spike indices
constexpr int kBitsplitMaxPlanes = 3;

// The resolved format of one bucket.
struct BitsplitFormat {
  int32_t bits = 4;       // 2..8
  int32_t group = 32;     // G: multiple of 32 in [32, 256]
  bool spikes = false;    // spike reserving
  bool log_scales = false;
  DType dtype = DType::kF32;  // bucket dtype: storage of the spike values

  DQ_HD int levels() const { return (1 << bits) - 1; }
};

// ---- planes -------------------------------------------------------------------------

DQ_HD int bitsplit_num_planes(int bits) {
  switch (bits) {
    case 3: case 5: case 6: return 2;
    case 7: return 3;
    default: return 1;  // 2, 4, 8
  }
}

// Width of plane p (most significant first).
DQ_HD int bitsplit_plane_width(int bits, int p) {
  switch (bits) {
    case 2: return 2;
    case 3: return p == 0 ? 2 : 1;
    case 4: return 4;
    case 5: return p == 0 ? 4 : 1;
    case 6: return p == 0 ? 4 : 2;
    case 7: return p == 0 ? 4 : p == 1 ? 2 : 1;
    default: return 8;
  }
}

// Position of plane p's field inside the code.
DQ_HD int bitsplit_plane_shift(int bits, int p) {
  int s = 0;
  for (int q = p + 1; q < bitsplit_num_planes(bits); ++q) s += bitsplit_plane_width(bits, q);
  return s;
}

// ---- sizes --------------------------------------------------------------------------

DQ_HD int64_t bitsplit_code_bytes(const BitsplitFormat& f) { return int64_t(f.group) * f.bits / 8; }
DQ_HD int64_t bitsplit_scale_bytes(const BitsplitFormat& f) { return f.log_scales ? 2 : 4; }
DQ_HD int64_t bitsplit_spike_value_bytes(const BitsplitFormat& f) { return dtype_size(f.dtype); }
DQ_HD int64_t bitsplit_spike_bytes(const BitsplitFormat& f) {
  return f.spikes ? 2 * (bitsplit_spike_value_bytes(f) + 1) : 0;
}
// Wire bytes of one group (full or partial: a partial group is padded).
DQ_HD int64_t bitsplit_group_bytes(const BitsplitFormat& f) {
  return bitsplit_code_bytes(f) + bitsplit_scale_bytes(f) + bitsplit_spike_bytes(f);
}

// Section offsets of a block message of ng groups.
struct BitsplitLayout {
  int64_t ng = 0;
  int64_t plane[kBitsplitMaxPlanes] = {0, 0, 0};
  int64_t spike_values = 0;
  int64_t scales = 0;
  int64_t spike_index = 0;
  int64_t total = 0;
};

DQ_HD BitsplitLayout bitsplit_layout(const BitsplitFormat& f, int64_t ng) {
  BitsplitLayout l;
  l.ng = ng;
  int64_t off = 0;
  for (int p = 0; p < bitsplit_num_planes(f.bits); ++p) {
    l.plane[p] = off;
    off += ng * f.group * bitsplit_plane_width(f.bits, p) / 8;
  }
  l.spike_values = off;
  if (f.spikes) off += ng * 2 * bitsplit_spike_value_bytes(f);
  l.scales = off;
  off += ng * bitsplit_scale_bytes(f);
  l.spike_index = off;
  if (f.spikes) off += ng * 2;
  l.total = off;
  return l;
}

// ---- pack / unpack one plane -------------------------------------------------------------
// codes[0, n) (n a multiple of 32) -> plane bits: field (codes[i] >> shift) & mask
// at bit i*W. Word k of the plane holds slots [k*32/W, (k+1)*32/W).

template <int W>
DQ_HD void bitsplit_pack_plane_t(const uint8_t* codes, int n, int shift, uint8_t* plane) {
  constexpr int kPer = 32 / W;
  constexpr uint32_t kMask = W == 8 ? 0xffu : (1u << W) - 1u;
  for (int k = 0; k < n / kPer; ++k) {
    uint32_t w = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kPer; ++j) w |= ((uint32_t(codes[k * kPer + j]) >> shift) & kMask) << (j * W);
    store_u32_aligned(plane + 4 * k, w);
  }
}

// codes[i] |= field_i << shift (the caller zeroes codes before the first
// plane). Read byte by byte: the same bits as the 32-bit words above, in a
// loop the host compiler vectorises.
template <int W>
DQ_HD void bitsplit_unpack_plane_t(const uint8_t* plane, int n, int shift, uint8_t* codes) {
  constexpr int kPer = 8 / W;
  constexpr uint32_t kMask = W == 8 ? 0xffu : (1u << W) - 1u;
  for (int m = 0; m < n / kPer; ++m) {
    const uint32_t b = plane[m];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kPer; ++j)
      codes[m * kPer + j] = uint8_t(codes[m * kPer + j] | (((b >> (j * W)) & kMask) << shift));
  }
}

DQ_HD void bitsplit_pack_plane(const uint8_t* codes, int n, int width, int shift, uint8_t* plane) {
  switch (width) {
    case 1: bitsplit_pack_plane_t<1>(codes, n, shift, plane); break;
    case 2: bitsplit_pack_plane_t<2>(codes, n, shift, plane); break;
    case 4: bitsplit_pack_plane_t<4>(codes, n, shift, plane); break;
    default: bitsplit_pack_plane_t<8>(codes, n, shift, plane); break;
  }
}

DQ_HD void bitsplit_unpack_plane(const uint8_t* plane, int n, int width, int shift, uint8_t* codes) {
  switch (width) {
    case 1: bitsplit_unpack_plane_t<1>(plane, n, shift, codes); break;
    case 2: bitsplit_unpack_plane_t<2>(plane, n, shift, codes); break;
    case 4: bitsplit_unpack_plane_t<4>(plane, n, shift, codes); break;
    default: bitsplit_unpack_plane_t<8>(plane, n, shift, codes); break;
  }
}

// ---- float helpers (IEEE operations only, identical on host and device) -----------------

DQ_HD float bs_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
DQ_HD float bs_floor(float x) {
#if defined(__CUDA_ARCH__)
  return floorf(x);
#else
  return std::floor(x);
#endif
}
DQ_HD float bs_rint(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
// Plain compare-select min/max: the same result on every compiler and device.
DQ_HD float bs_min(float a, float b) { return b < a ? b : a; }
DQ_HD float bs_max(float a, float b) { return b > a ? b : a; }
// v clamped to [lo, hi]; NaN gives lo (so a float-to-int conversion after it is defined).
DQ_HD float bs_clamp(float v, float lo, float hi) { return v > lo ? (v < hi ? v : hi) : lo; }
// x * 2^e, exact (no overflow or underflow for the scales used here).
DQ_HD float bs_ldexp(float x, int e) {
#if defined(__CUDA_ARCH__)
  return ldexpf(x, e);
#else
  return std::ldexp(x, e);
#endif
}

// Largest bf16 <= f (f finite).
DQ_HD uint16_t bf16_bits_down(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t h = uint16_t(u >> 16);
  if ((u & 0xffffu) == 0) return h;
  return (u & 0x80000000u) ? uint16_t(h + 1) : h;  // negative: grow the magnitude
}
// Smallest bf16 >= f for f >= 0 (finite); +0 for +-0.
DQ_HD uint16_t bf16_bits_up_pos(float f) {
  const uint32_t u = f32_bits(f) & 0x7fffffffu;
  const uint16_t h = uint16_t(u >> 16);
  return (u & 0xffffu) ? uint16_t(h + 1) : h;
}

// Spike value storage in the bucket dtype.
DQ_HD float bitsplit_round_to_dtype(float v, DType t) {
  switch (t) {
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(v));
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

// ---- scales ---------------------------------------------------------------------------

// 2^(j/10) for j = 0..9 as float32 (the format's definition of the log scale).
DQ_HD float bitsplit_pow2_tenth(int j) {
  switch (j) {
    case 1: return 0x1.125fbep+0f;
    case 2: return 0x1.261118p+0f;
    case 3: return 0x1.3b2c48p+0f;
    case 4: return 0x1.51cb46p+0f;
    case 5: return 0x1.6a09e6p+0f;
    case 6: return 0x1.8406p+0f;
    case 7: return 0x1.9fdf8cp+0f;
    case 8: return 0x1.bdb8cep+0f;
    case 9: return 0x1.ddb68p+0f;
    default: return 1.0f;
  }
}

constexpr int kBitsplitLogKMin = -256, kBitsplitLogKMax = 255;
constexpr int kBitsplitLogZMin = -64, kBitsplitLogZMax = 63;

// scale = 2^(k/10), exactly as decoded.
DQ_HD float bitsplit_log_scale(int k) {
  const int e = k >= 0 ? k / 10 : -((-k + 9) / 10);  // floor(k / 10)
  return bs_ldexp(bitsplit_pow2_tenth(k - 10 * e), e);
}
// Step of the zero code: L * scale / 64.
DQ_HD float bitsplit_log_zero_step(float scale, int L) { return bs_ldexp(scale * float(L), -6); }

DQ_HD uint16_t bitsplit_log_word(int k, int z) {
  return uint16_t((uint32_t(k) & 0x1ffu) | ((uint32_t(z) & 0x7fu) << 9));
}
DQ_HD int bitsplit_log_word_k(uint16_t w) { return int(int32_t(uint32_t(w) << 23) >> 23); }
DQ_HD int bitsplit_log_word_z(uint16_t w) { return int(int32_t(uint32_t(w) << 16) >> 25); }

// The metadata of one group, as the decoder sees it.
struct BitsplitGroup {
  float zero = 0.0f, scale = 0.0f;
  uint16_t s0 = 0, s1 = 0;  // stored words: bf16 (scale, zero), or (log word, unused)
  int imin = 0, imax = 0;   // spikes: in-group indices
  float vmin = 0.0f, vmax = 0.0f;  // spikes: values as stored (bucket dtype)
};

DQ_HD void bitsplit_decode_scales(const BitsplitFormat& f, BitsplitGroup& g) {
  if (f.log_scales) {
    const int k = bitsplit_log_word_k(g.s0), z = bitsplit_log_word_z(g.s0);
    g.scale = bitsplit_log_scale(k);
    g.zero = float(z) * bitsplit_log_zero_step(g.scale, f.levels());
  } else {
    g.scale = bf16_to_f32(g.s0);
    g.zero = bf16_to_f32(g.s1);
  }
}

// bf16 scale and zero for [lo, hi] (lo <= hi, finite): zero = lo rounded
// down, scale = (hi - zero)/L rounded up, then raised by one bf16 ulp while
// the decoder's top level fma(L, scale, zero) is below hi. The float
// subtraction and division lose at most 2^-23 relative and one bf16 ulp is
// 2^-8 relative, so one raise always suffices (the second is a guard).
// Branch-free, so a loop over groups vectorises.
DQ_HD void bitsplit_scales_bf16(float lo, float hi, float Lf, uint16_t& sb, uint16_t& zb) {
  // (lo below -3.3895e38, the most negative finite bf16, would round down to
  // -inf: the zero stays finite, and lo codes as the zero, clipped by less
  // than 1.4e36, one bf16 ulp there)
  zb = bf16_bits_down(lo);
  zb = zb == 0xff80u ? uint16_t(0xff7fu) : zb;
  const float zero = bf16_to_f32(zb);
  // hi - zero overflows for ranges beyond FLT_MAX (values of both signs near
  // 3e38): then the quotient is taken on quarters (exact power-of-two
  // factors). Selected on the bit pattern, so the loop over groups stays
  // branch-free.
  const float d = hi - zero;
  const float q_plain = d / Lf;
  const float q_quarter = ((hi * 0.25f - zero * 0.25f) / Lf) * 4.0f;
  const float q = (f32_bits(d) & 0x7fffffffu) < 0x7f800000u ? q_plain : q_quarter;
  uint16_t s = bf16_bits_up_pos(q);
  s = uint16_t(s + (bs_fma(Lf, bf16_to_f32(s), zero) < hi ? 1 : 0));
  s = uint16_t(s + (bs_fma(Lf, bf16_to_f32(s), zero) < hi ? 1 : 0));
  // hi near FLT_MAX: the top level may round to inf. One bf16 ulp less keeps
  // it finite; values above it then code as the top level, clipped by less
  // than L * ulp(scale) <= 2^-7 * L * scale (about 2^-7 of the range; biased).
  s = uint16_t(s - ((f32_bits(bs_fma(Lf, bf16_to_f32(s), zero)) & 0x7fffffffu) >= 0x7f800000u ? 1 : 0));
  sb = s;
}

// Chooses the stored scale and zero for the range [lo, hi] (lo <= hi, finite).
DQ_HD void bitsplit_choose_scales(const BitsplitFormat& f, float lo, float hi, BitsplitGroup& g) {
  const int L = f.levels();
  const float Lf = float(L);
  if (!f.log_scales) {
    bitsplit_scales_bf16(lo, hi, Lf, g.s0, g.s1);
    g.scale = bf16_to_f32(g.s0);
    g.zero = bf16_to_f32(g.s1);
    return;
  }
  // Lower bound of the scale: the range needs L*s >= hi - lo; zero >= -L*s
  // needs s >= -lo/L; zero <= 63/64 L*s needs s >= hi / (127/64 L).
  float slb = (hi - lo) / Lf;
  slb = bs_max(slb, -lo / Lf);
  slb = bs_max(slb, hi / (Lf * (127.0f / 64.0f)));
  // Start just below the smallest k with 2^(k/10) >= slb: floor(log2(slb))
  // from the exponent bits, tenths from the mantissa against the table (exact
  // everywhere), minus one for the rounding of slb itself.
  int k0 = kBitsplitLogKMin;
  if (slb > 0.0f) {
    if (!(slb < 3.0e38f)) {
      k0 = kBitsplitLogKMax;
    } else {
      const uint32_t u = f32_bits(slb);
      const int ebits = int((u >> 23) & 0xffu);
      if (ebits > 0) {  // (subnormal slb: below every k)
        const float m = bits_f32((u & 0x7fffffu) | 0x3f800000u);  // mantissa in [1, 2)
        int j = 0;
        for (int t = 1; t < 10; ++t) j += m >= bitsplit_pow2_tenth(t) ? 1 : 0;
        k0 = 10 * (ebits - 127) + j - 1;
        if (k0 < kBitsplitLogKMin) k0 = kBitsplitLogKMin;
        if (k0 > kBitsplitLogKMax) k0 = kBitsplitLogKMax;
      }
    }
  }
  int best_k = kBitsplitLogKMax, best_z = 0;
  bool found = false;
  for (int k = k0; k <= kBitsplitLogKMax && !found; ++k) {
    const float s = bitsplit_log_scale(k);
    const float zs = bitsplit_log_zero_step(s, L);
    const float zf = bs_clamp(bs_floor(lo / zs), float(kBitsplitLogZMin), float(kBitsplitLogZMax));
    int z = int(zf);
    while (z > kBitsplitLogZMin && float(z) * zs > lo) --z;
    const float zero = float(z) * zs;
    if (zero <= lo && bs_fma(Lf, s, zero) >= hi) {
      best_k = k;
      best_z = z;
      found = true;
    } else if (k == kBitsplitLogKMax) {
      best_z = z;  // out of range (|x| > ~1e9): clamp
    }
  }
  g.s0 = bitsplit_log_word(best_k, best_z);
  g.s1 = 0;
  bitsplit_decode_scales(f, g);
}

// ---- one group --------------------------------------------------------------------------

// Metadata of a group x[0, cnt) (x[cnt, G) ignored). With spikes, the first
// minimum and first maximum are reserved and [lo, hi] excludes them.
// The range [lo, hi] to quantise of a group x[0, cnt) (x[cnt, G) ignored):
// its [min, max], or with spikes the [min, max] without its first minimum
// and first maximum (whose indices go to imin, imax; 0 without spikes).
DQ_HD void bitsplit_group_range(const float* x, int cnt, const BitsplitFormat& f, float& lo_out,
                                float& hi_out, int& imin_out, int& imax_out) {
  const int G = f.group;
  const float kInf = bits_f32(0x7f800000u);
  float lo, hi;
  imin_out = imax_out = 0;
  // One scan in eight independent lanes, so the host compiler vectorises it.
  if (!f.spikes) {
    float mn[8], mx[8];
    for (int j = 0; j < 8; ++j) {
      mn[j] = kInf;
      mx[j] = -kInf;
    }
    for (int i = 0; i < G; i += 8)
      for (int j = 0; j < 8; ++j) {
        const bool valid = i + j < cnt;
        const float v = x[i + j];
        const float vl = valid ? v : kInf;
        const float vh = valid ? v : -kInf;
        mn[j] = bs_min(mn[j], vl);
        mx[j] = bs_max(mx[j], vh);
      }
    lo = mn[0];
    hi = mx[0];
    for (int j = 1; j < 8; ++j) {
      lo = bs_min(lo, mn[j]);
      hi = bs_max(hi, mx[j]);
    }
  } else {
    // Per lane: smallest value with its first index, second smallest (of the
    // lane's multiset), and the same for the largest. Without the two spike
    // elements, the group's range is [second smallest, second largest] of the
    // group's multiset (if an element is left at all): removing one copy of
    // the min and one of the max leaves exactly those as extremes.
    float m1[8], m2[8], M1[8], M2[8];
    int32_t i1[8], I1[8];
    for (int j = 0; j < 8; ++j) {
      m1[j] = m2[j] = kInf;
      M1[j] = M2[j] = -kInf;
      i1[j] = I1[j] = 0;
    }
    for (int i = 0; i < G; i += 8)
      for (int j = 0; j < 8; ++j) {
        const int32_t idx = i + j;
        const bool valid = idx < cnt;
        const float v = x[idx];
        const float vl = valid ? v : kInf;
        const float vh = valid ? v : -kInf;
        // Written as min/max and bit masks: with selects GCC emits an
        // "any lane changed?" branch per vector, which mispredicts.
        const int32_t lt = -int32_t(vl < m1[j]);
        const int32_t gt = -int32_t(vh > M1[j]);
        m2[j] = bs_min(m2[j], bs_max(m1[j], vl));  // = lt ? m1 : min(m2, vl)
        m1[j] = bs_min(m1[j], vl);
        M2[j] = bs_max(M2[j], bs_min(M1[j], vh));
        M1[j] = bs_max(M1[j], vh);
        i1[j] = (i1[j] & ~lt) | (idx & lt);
        I1[j] = (I1[j] & ~gt) | (idx & gt);
      }
    // Lanes -> group, as plain min/max chains (no data-dependent branches:
    // random data would mispredict them). Ties go to the lowest index, the
    // first occurrence; lane j holds the indices = j mod 8.
    lo = m1[0];
    hi = M1[0];
    for (int j = 1; j < 8; ++j) {
      lo = bs_min(lo, m1[j]);
      hi = bs_max(hi, M1[j]);
    }
    int32_t imin = 0x7fffffff, imax = 0x7fffffff;
    for (int j = 0; j < 8; ++j) {
      const int32_t a = m1[j] == lo ? i1[j] : 0x7fffffff;
      const int32_t b = M1[j] == hi ? I1[j] : 0x7fffffff;
      imin = a < imin ? a : imin;
      imax = b < imax ? b : imax;
    }
    const int jl = imin & 7, jh = imax & 7;
    float lo2 = kInf, hi2 = -kInf;
    for (int j = 0; j < 8; ++j) {
      lo2 = bs_min(lo2, j == jl ? m2[j] : m1[j]);
      hi2 = bs_max(hi2, j == jh ? M2[j] : M1[j]);
    }
    imin_out = imin;
    imax_out = imax;
    const int rest = cnt - (imin == imax ? 1 : 2);
    lo = rest > 0 ? lo2 : 0.0f;
    hi = rest > 0 ? hi2 : 0.0f;
  }
  // -0 and +0 compare equal: canonicalise so the reduction order cannot change
  // the stored bytes.
  lo_out = lo + 0.0f;
  hi_out = hi + 0.0f;
}

// Metadata of a group x[0, cnt): range, spikes (values rounded to the bucket
// dtype), scale and zero.
DQ_HD void bitsplit_group_params(const float* x, int cnt, const BitsplitFormat& f, BitsplitGroup& g) {
  float lo, hi;
  bitsplit_group_range(x, cnt, f, lo, hi, g.imin, g.imax);
  g.vmin = f.spikes ? bitsplit_round_to_dtype(x[g.imin], f.dtype) : 0.0f;
  g.vmax = f.spikes ? bitsplit_round_to_dtype(x[g.imax], f.dtype) : 0.0f;
  bitsplit_choose_scales(f, lo, hi, g);
}

// Scales below kBitsplitTinyScale are lifted by kBitsplitTinyLift (with the
// values) before the reciprocal is taken: see bitsplit_quantize_group.
constexpr float kBitsplitTinyScale = 0x1p-100f;
constexpr float kBitsplitTinyLift = 0x1p100f;
// Scales above kBitsplitHugeScale are quantised on quarters (see
// bitsplit_quantize_group): a group's range may exceed FLT_MAX.
constexpr float kBitsplitHugeScale = 0x1p100f;

// Reciprocal of the scale used by the quantiser (0 for a zero scale).
DQ_HD float bitsplit_rcp(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

// (int32 conversions: t is already clamped to [0, L], and float -> int32 is
// one instruction where float -> uint32 is not.)
DQ_HD uint32_t bitsplit_quant_nearest(float x, float zero, float rcp, float Lf) {
  const float t = bs_rint((x - zero) * rcp);
  return uint32_t(int32_t(bs_clamp(t, 0.0f, Lf)));
}

// floor(t + u) clamped to [0, L], as a clamp then a truncation (equal for
// every t, and a conversion the host compiler vectorises where floor is not).
DQ_HD uint32_t bitsplit_quant_stochastic(float x, float zero, float rcp, float Lf, float u) {
  const float t = bs_fma(x - zero, rcp, u);
  return uint32_t(int32_t(bs_clamp(t, 0.0f, Lf)));
}

DQ_HD float bitsplit_dequant(uint32_t q, float zero, float scale) {
  return bs_fma(float(int32_t(q)), scale, zero);
}

// Stochastic rounding draws. One Philox4x32-10 call serves 8 consecutive
// elements: counter = (element index / 8 as 64 bits: low word, high word;
// kPurposeValue; rank), key = (seed, collective sequence number); element
// 8m + 2j + h takes the low (h = 0) or high (h = 1) 16 bits of word j as
// u = bits / 2^16. 16-bit uniforms halve the Philox work (the CPU kernels'
// largest cost); they bias stochastic rounding by at most 2^-16 of a step.
DQ_HD float bitsplit_u16(uint32_t bits16) { return float(int32_t(bits16)) * (1.0f / 65536.0f); }

// u[0, n) for elements [e, e + n) (e and n multiples of 8).
DQ_HD void bitsplit_uniforms(RngKey key, uint32_t rank, int64_t e, int n, float* u) {
  const uint64_t m0 = uint64_t(e) >> 3;
  const uint32_t lo = uint32_t(m0), hi = uint32_t(m0 >> 32);
  const int nm = n >> 3;
  if (uint64_t(lo) + uint64_t(nm) <= 0x100000000ull) {
    // No carry into the high counter word: a loop the host compiler vectorises.
    for (int m = 0; m < nm; ++m) {
      const Philox4x32 r = philox4x32_10(lo + uint32_t(m), hi, kPurposeValue, rank, key.k0, key.k1);
      for (int j = 0; j < 4; ++j) {
        u[8 * m + 2 * j] = bitsplit_u16(r.v[j] & 0xffffu);
        u[8 * m + 2 * j + 1] = bitsplit_u16(r.v[j] >> 16);
      }
    }
  } else {
    for (int m = 0; m < nm; ++m) {
      const uint64_t c = m0 + uint64_t(m);
      const Philox4x32 r =
          philox4x32_10(uint32_t(c), uint32_t(c >> 32), kPurposeValue, rank, key.k0, key.k1);
      for (int j = 0; j < 4; ++j) {
        u[8 * m + 2 * j] = bitsplit_u16(r.v[j] & 0xffffu);
        u[8 * m + 2 * j + 1] = bitsplit_u16(r.v[j] >> 16);
      }
    }
  }
}

// Codes of group x[0, cnt). `u` holds the group's uniforms (bitsplit_uniforms
// of its elements) when stochastic, else is unused. Slots >= cnt and spike
// slots get code 0.
DQ_HD void bitsplit_quantize_group(const float* x, int cnt, const BitsplitGroup& g,
                                   const BitsplitFormat& f, bool stochastic, const float* u,
                                   uint8_t* codes) {
  const int G = f.group;
  const float Lf = float(f.levels());
  const float zero = g.zero;
  if (g.scale > kBitsplitHugeScale) {
    // x - zero may overflow float when the group's range exceeds FLT_MAX:
    // t = (x/4 - zero/4) * (1 / (scale/4)), the same number wherever the
    // plain path does not overflow (up to subnormal x/4, irrelevant here).
    const float rcp = bitsplit_rcp(g.scale * 0.25f);
    for (int i = 0; i < G; ++i) {
      const float d = x[i] * 0.25f - zero * 0.25f;
      codes[i] = uint8_t(stochastic ? bitsplit_quant_stochastic(d, 0.0f, rcp, Lf, u[i])
                                    : bitsplit_quant_nearest(d, 0.0f, rcp, Lf));
    }
  } else if (g.scale < kBitsplitTinyScale) {
    // 1/scale overflows float for scales below 2^-128 (groups whose range is
    // below ~1e-36): t = ((x - zero) * 2^100) * (1 / (scale * 2^100)), the
    // power-of-two factors exact (x - zero is tiny here), so t is the same
    // number the plain path computes wherever that does not overflow.
    const float rcp = bitsplit_rcp(g.scale * kBitsplitTinyLift);
    for (int i = 0; i < G; ++i) {
      const float d = (x[i] - zero) * kBitsplitTinyLift;
      codes[i] = uint8_t(stochastic ? bitsplit_quant_stochastic(d, 0.0f, rcp, Lf, u[i])
                                    : bitsplit_quant_nearest(d, 0.0f, rcp, Lf));
    }
  } else if (stochastic) {
    const float rcp = bitsplit_rcp(g.scale);
    for (int i = 0; i < G; ++i)
      codes[i] = uint8_t(bitsplit_quant_stochastic(x[i], zero, rcp, Lf, u[i]));
  } else {
    const float rcp = bitsplit_rcp(g.scale);
    for (int i = 0; i < G; ++i) codes[i] = uint8_t(bitsplit_quant_nearest(x[i], zero, rcp, Lf));
  }
  for (int i = cnt; i < G; ++i) codes[i] = 0;
  if (f.spikes) {
    codes[g.imin] = 0;
    codes[g.imax] = 0;
  }
}

// y[0, G): dequantised group, spikes restored, slots >= cnt set to 0.
DQ_HD void bitsplit_dequantize_group(const uint8_t* codes, int cnt, const BitsplitGroup& g,
                                     const BitsplitFormat& f, float* y) {
  const int G = f.group;
  for (int i = 0; i < G; ++i) y[i] = bitsplit_dequant(codes[i], g.zero, g.scale);
  for (int i = cnt; i < G; ++i) y[i] = 0.0f;
  if (f.spikes) {
    y[g.imin] = g.vmin;
    y[g.imax] = g.vmax;
  }
}

// ---- metadata in the block -------------------------------------------------------------

DQ_HD void bitsplit_store_meta(uint8_t* blk, const BitsplitLayout& l, const BitsplitFormat& f,
                               int64_t gi, const BitsplitGroup& g) {
  if (f.log_scales) {
    store_u16_aligned(blk + l.scales + 2 * gi, g.s0);
  } else {
    store_u16_aligned(blk + l.scales + 4 * gi, g.s0);
    store_u16_aligned(blk + l.scales + 4 * gi + 2, g.s1);
  }
  if (f.spikes) {
    uint8_t* sv = blk + l.spike_values;
    switch (f.dtype) {
      case DType::kF32:
        store_u32_aligned(sv + 8 * gi, f32_bits(g.vmin));
        store_u32_aligned(sv + 8 * gi + 4, f32_bits(g.vmax));
        break;
      case DType::kBF16:
        store_u16_aligned(sv + 4 * gi, f32_to_bf16(g.vmin));
        store_u16_aligned(sv + 4 * gi + 2, f32_to_bf16(g.vmax));
        break;
      case DType::kF16:
        store_u16_aligned(sv + 4 * gi, f32_to_f16(g.vmin));
        store_u16_aligned(sv + 4 * gi + 2, f32_to_f16(g.vmax));
        break;
    }
    blk[l.spike_index + 2 * gi] = uint8_t(g.imin);
    blk[l.spike_index + 2 * gi + 1] = uint8_t(g.imax);
  }
}

// Reads group gi's metadata. Returns false if a spike index is outside the
// group's cnt elements (a malformed message).
DQ_HD bool bitsplit_load_meta(const uint8_t* blk, const BitsplitLayout& l, const BitsplitFormat& f,
                              int64_t gi, int cnt, BitsplitGroup& g) {
  if (f.log_scales) {
    g.s0 = load_u16_aligned(blk + l.scales + 2 * gi);
    g.s1 = 0;
  } else {
    g.s0 = load_u16_aligned(blk + l.scales + 4 * gi);
    g.s1 = load_u16_aligned(blk + l.scales + 4 * gi + 2);
  }
  bitsplit_decode_scales(f, g);
  g.imin = g.imax = 0;
  g.vmin = g.vmax = 0.0f;
  if (!f.spikes) return true;
  const uint8_t* sv = blk + l.spike_values;
  switch (f.dtype) {
    case DType::kF32:
      g.vmin = bits_f32(load_u32_aligned(sv + 8 * gi));
      g.vmax = bits_f32(load_u32_aligned(sv + 8 * gi + 4));
      break;
    case DType::kBF16:
      g.vmin = bf16_to_f32(load_u16_aligned(sv + 4 * gi));
      g.vmax = bf16_to_f32(load_u16_aligned(sv + 4 * gi + 2));
      break;
    case DType::kF16:
      g.vmin = f16_to_f32(load_u16_aligned(sv + 4 * gi));
      g.vmax = f16_to_f32(load_u16_aligned(sv + 4 * gi + 2));
      break;
  }
  g.imin = blk[l.spike_index + 2 * gi];
  g.imax = blk[l.spike_index + 2 * gi + 1];
  if (g.imin >= cnt || g.imax >= cnt) {
    g.imin = g.imax = 0;
    return false;
  }
  return true;
}

// ---- one group, end to end (the CUDA kernels' per-thread work) -------------------------

// Encodes group gi of a block: x[0, G) its values (x[cnt, G) ignored), e its
// first bucket element. u and codes are scratch of G entries.
DQ_HD void bitsplit_encode_group(const float* x, int cnt, int64_t e, int64_t gi,
                                 const BitsplitFormat& f, const BitsplitLayout& lay,
                                 bool stochastic, RngKey key, uint32_t rank, float* u,
                                 uint8_t* codes, uint8_t* out) {
  const int G = f.group;
  BitsplitGroup g;
  bitsplit_group_params(x, cnt, f, g);
  if (stochastic) bitsplit_uniforms(key, rank, e, G, u);
  bitsplit_quantize_group(x, cnt, g, f, stochastic, u, codes);
  bitsplit_store_meta(out, lay, f, gi, g);
  for (int p = 0; p < bitsplit_num_planes(f.bits); ++p) {
    const int w = bitsplit_plane_width(f.bits, p);
    bitsplit_pack_plane(codes, G, w, bitsplit_plane_shift(f.bits, p), out + lay.plane[p] + gi * G * w / 8);
  }
}

// Decodes group gi of a block into y[0, G) (zero past cnt). codes is scratch
// of G entries. Returns false for a malformed spike index.
DQ_HD bool bitsplit_decode_group(const uint8_t* in, const BitsplitLayout& lay,
                                 const BitsplitFormat& f, int64_t gi, int cnt, uint8_t* codes,
                                 float* y) {
  const int G = f.group;
  for (int i = 0; i < G; ++i) codes[i] = 0;
  for (int p = 0; p < bitsplit_num_planes(f.bits); ++p) {
    const int w = bitsplit_plane_width(f.bits, p);
    bitsplit_unpack_plane(in + lay.plane[p] + gi * G * w / 8, G, w, bitsplit_plane_shift(f.bits, p), codes);
  }
  BitsplitGroup g;
  const bool ok = bitsplit_load_meta(in, lay, f, gi, cnt, g);
  bitsplit_dequantize_group(codes, cnt, g, f, y);
  return ok;
}

}  // namespace dynamiq
