// CUDA kernels of the DynamiQ codec (see dynamiq_kernels.h and README.md,
// "CUDA kernels"): every per-element and per-group computation is the same
// __host__ __device__ function of dynamiq_math.h the CPU codec calls, in the
// same arithmetic order (group maxima are exact maxima of bit patterns, so
// the reduction order does not matter), so the bytes are the CPU's.
//
// A thread holds an octet: 8 contiguous values of a super-group (SG) in
// registers, loaded and stored 16 bytes at a time where aligned, the 8
// elements one value Philox call rounds (and two permutation calls stratify;
// README.md, "Randomness"). Two shapes:
//  - warp path (S in {64, 128, 256}, s a multiple of 8): a team of S/8
//    consecutive lanes per SG, 256-thread blocks of several SGs. Group and SG
//    maxima are xor-shuffle reductions and the planar code bytes are
//    assembled by a butterfly of shuffles: no shared memory, no barrier.
//  - block path (every other format): one block per SG, the SG in shared
//    memory (group maxima by shared atomics, the code bytes packed there),
//    each thread still drawing one value call per octet.
#include "kernels/dynamiq/cuda/dynamiq_kernels.h"
#include "kernels/dynamiq/cuda/dynamiq_octets.cuh"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"

#include <cuda_runtime.h>

#include <string>

namespace dynamiq {
namespace cuda {
namespace {

using octet::Oct;

// kDecAccOut: the reduce-scatter sink (Codec::decompress_accumulate_output),
// decompress-accumulate's sum stored as kDecompress stores its values.
enum Kind : int { kCompress = 0, kFused = 1, kDecAcc = 2, kDecompress = 3, kDecAccOut = 4 };

constexpr int kThreads = 256;  // threads per block (the block path: up to)
constexpr int kMinBlocks = 4;  // 4 x 256 threads per SM at most 64 registers each: 50 % occupancy

// Largest S the kernels accept (the block path's shared memory: 5 bytes per element + 8 per group).
constexpr int kMaxS = 8192;
constexpr size_t kMaxSharedBytes = 48 * 1024;  // per block without cudaFuncSetAttribute

size_t shared_bytes(const DynamiqFormat& f) { return size_t(f.S) * 5 + size_t(f.S / f.s) * 8 + 16; }

bool warp_path(const DynamiqFormat& f) { return (f.S == 64 || f.S == 128 || f.S == 256) && f.s % 8 == 0; }

// v from lane ^ d of the warp (d < 32), every lane of the warp calling.
template <class T>
DQ_DEVICE T shfl_xor(T v, int d) {
  return __shfl_xor_sync(0xffffffffu, v, d);
}

DQ_DEVICE uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

struct Args {
  DynamiqFormat f;
  bool stochastic_scales;
  DqTables tb;
  DevicePlan p;
  DeviceLocal x;
  int64_t w0, w1;
  DqRounding rd;
  const uint8_t* in;
  uint8_t* out;
  float* acc;
  DeviceOutput y;
  float recip;  // exact_reciprocal(y.divisor): 1 / divisor when exact, else 0
};

// The local values of elements [i0, i0 + 8) of wire position w (load_unit):
// the accumulator as it is, or the bucket less the SG's bias, 0 past its end.
DQ_DEVICE void load_local(const Args& a, int64_t w, int64_t src, int i0, int n, Oct& x) {
  if (a.x.acc) return octet::load_floats(a.x.acc + (w - a.x.acc_w0) * a.p.unit + i0, x);
  octet::load_values(a.p.dtype, a.x.bucket, src * a.p.unit + i0, n, x);
  if (a.p.bias) {
    const float b = a.p.bias[src];
DQ_UNROLL
    for (int e = 0; e < 8; ++e)
      if (e < n) x.v[e] -= b;
  }
}

// decompress's output (store_unit): + bias_scale * bias, / divisor (a
// multiply by the reciprocal where it is exact: the same bits).
DQ_DEVICE void store_output(const Args& a, int64_t src, int64_t i0, int n, Oct& x) {
  const float b = a.p.bias ? a.y.bias_scale * a.p.bias[src] : 0.0f;
  const float d = a.y.divisor, r = a.recip;
DQ_UNROLL
  for (int e = 0; e < 8; ++e) {
    float v = x.v[e];
    if (a.p.bias) v += b;
    if (d != 1.0f) v = r != 0.0f ? v * r : v / d;
    x.v[e] = v;
  }
  octet::store_values(a.p.dtype, a.y.bucket, i0, n, x);
}

// The random numbers of octet o (elements 8o + e) of source SG src, drawn
// once for its 8 elements whatever their width: the value call (rounding
// words: dq_octet_word(vr, e)) and the strata from the two permutation calls.
DQ_DEVICE void draw_octet(const DqRounding& rd, int64_t src, int S, int o, Philox4x32& vr, Oct& pi) {
  vr = Philox4x32{{0u, 0u, 0u, 0u}};
  if (rd.stochastic) vr = dq_draw(rd.key, uint64_t(src) * uint64_t(S / 8) + uint64_t(o), kPurposeValue, rd.rank);
DQ_UNROLL
  for (int e = 0; e < 8; ++e) pi.v[e] = 0.0f;
  if (rd.correlated) {
    const uint64_t c = uint64_t(src) * uint64_t(S / 4) + uint64_t(2 * o);
    const Philox4x32 p0 = dq_draw(rd.key, c, kPurposePermutation, 0);
    const Philox4x32 p1 = dq_draw(rd.key, c + 1, kPurposePermutation, 0);
DQ_UNROLL
    for (int e = 0; e < 8; ++e) pi.v[e] = float(perm_eval(rd.perm, e < 4 ? p0.v[e & 3] : p1.v[e & 3]));
  }
}

// The codes of an octet's values x (width B < 16, element e normalised by
// inv.v[e]) in byte slots: code e in byte e, shifted by `shift`.
template <int B>
DQ_DEVICE uint64_t encode_octet(const Args& a, const Oct& x, const Oct& inv, const Philox4x32& vr, const Oct& pi,
                                int shift) {
  const DqRounding& rd = a.rd;
  const DqLevels& lv = a.tb.lv[dynamiq_width_index(B)];
  uint32_t h[2] = {0u, 0u};  // bytes 0-3 and 4-7
DQ_UNROLL
  for (int e = 0; e < 8; ++e) {
    const uint32_t w = rd.stochastic ? dq_octet_word(vr, e) : 0u;
    uint32_t c;
    if constexpr (B == 1)
      c = dq_encode_sign(x.v[e], inv.v[e], pi.v[e], w, rd);
    else
      c = dq_encode_value<B>(lv, x.v[e], inv.v[e], pi.v[e], w, rd);
    h[e / 4] |= c << (8 * (e % 4));
  }
  // a code and its shift (at most 8 - B) stay inside its byte: shift each word
  return (uint64_t(h[1] << shift) << 32) | (h[0] << shift);
}

DQ_DEVICE uint64_t encode_octet(const Args& a, int B, const Oct& x, const Oct& inv, const Philox4x32& vr,
                                const Oct& pi, int shift) {
  switch (B) {
    case 1: return encode_octet<1>(a, x, inv, vr, pi, shift);
    case 2: return encode_octet<2>(a, x, inv, vr, pi, shift);
    case 4: return encode_octet<4>(a, x, inv, vr, pi, shift);
    default: return encode_octet<8>(a, x, inv, vr, pi, shift);
  }
}

// Width 16: the values as bf16 (round to nearest even), little-endian.
DQ_DEVICE void bf16_octet(const Oct& x, uint64_t& h0, uint64_t& h1) {
  h0 = h1 = 0;
DQ_UNROLL
  for (int e = 0; e < 4; ++e) {
    h0 |= uint64_t(f32_to_bf16(x.v[e])) << (16 * e);
    h1 |= uint64_t(f32_to_bf16(x.v[e + 4])) << (16 * e);
  }
}

// ---- warp path ----------------------------------------------------------------------

// Decodes octet t of the SG at in_sg (width B) into x: x = value, or
// x + value when kAcc (fmaf, as the CPU's std::fma).
template <int B, bool kAcc>
DQ_DEVICE void decode_octet(const Args& a, const uint8_t* in_sg, int t, Oct& x) {
  if constexpr (B == 16) {
    const uint64_t h0 = octet::load_bytes8(in_sg + 16 * t), h1 = octet::load_bytes8(in_sg + 16 * t + 8);
DQ_UNROLL
    for (int e = 0; e < 8; ++e) {
      const float v = bf16_to_f32(uint16_t((e < 4 ? h0 : h1) >> (16 * (e & 3))));
      x.v[e] = kAcc ? x.v[e] + v : v;
    }
  } else {
    const DynamiqFormat& f = a.f;
    const int O = f.S / 8, nbq = O * B / 8;  // octets per row of code bytes
    const int r = t % nbq, shift = (t / nbq) * B;
    const uint64_t X = octet::load_bytes8(in_sg + dynamiq_scale_bytes(B, f) + 8 * r);
    const float sc = dq_read_group_scale(in_sg, f, a.tb.r255, t / (f.s / 8));
    const float* dec = a.tb.lv[dynamiq_width_index(B)].decode;
DQ_UNROLL
    for (int e = 0; e < 8; ++e) {
      const float d = dec[(uint32_t(X >> (8 * e)) >> shift) & ((1u << B) - 1u)];
      x.v[e] = kAcc ? fmaf(d, sc, x.v[e]) : d * sc;
    }
  }
}

template <bool kAcc>
DQ_DEVICE void decode_octet(const Args& a, int B, const uint8_t* in_sg, int t, Oct& x) {
  switch (B) {
    case 1: return decode_octet<1, kAcc>(a, in_sg, t, x);
    case 2: return decode_octet<2, kAcc>(a, in_sg, t, x);
    case 4: return decode_octet<4, kAcc>(a, in_sg, t, x);
    case 8: return decode_octet<8, kAcc>(a, in_sg, t, x);
    default: return decode_octet<16, kAcc>(a, in_sg, t, x);
  }
}

// The scales of octet t's group (k = t / gl) from its maximum gb and the SG's
// mb (bit patterns): the SG scale to out_sg (t = 0) and the group's scale
// (the group's first octet) when `store`; returns 1 / normaliser.
DQ_DEVICE float warp_scales(const Args& a, int64_t src, int t, uint32_t gb, uint32_t mb, uint8_t* out_sg, bool store) {
  const DynamiqFormat& f = a.f;
  const int gl = f.s / 8, G = f.S / f.s, k = t / gl;
  const bool bad = mb >= 0x7f800000u;
  const bool first = store && t % gl == 0;
  if (f.hierarchical) {
    const uint16_t hb = bad ? uint16_t(0x7fc0u) : dq_sg_scale_bits(bits_f32(mb));
    const float Msg = bf16_to_f32(hb);
    if (store && t == 0) octet::store_bytes(out_sg, hb, 2);
    DqGroupScale gs{0, 0.0f, 0.0f};
    if (!bad) {
      gs = a.stochastic_scales
               ? dq_group_scale_stochastic(bits_f32(gb), Msg, a.tb.r255, dq_group_word(a.rd.key, a.rd.rank, src, G, k))
               : dq_group_scale_up(bits_f32(gb), Msg, a.tb.r255);
    }
    if (first) out_sg[2 + k] = gs.r;
    return gs.inv;
  }
  uint16_t hb;
  DqGroupScale gs = dq_group_scale_flat(bits_f32(gb), hb);
  if (bad) {
    hb = 0x7fc0u;
    gs.inv = 0.0f;
  }
  if (first) octet::store_bytes(out_sg + 2 * k, hb, 2);
  return gs.inv;
}

// Where a team's SG is: wire position w (its source SG src, width B, bytes
// at `wire` from the block's start), the elements [8t, 8t + n) of the
// thread's octet that lie in the bucket; `live`: false for a team past the
// range, which works on the last SG (every lane of a warp takes part in its
// shuffles) and stores nothing.
struct SgPos {
  int64_t w, src, wire;
  int B, t, n;
  bool live;
};

template <int Kind>
DQ_DEVICE void warp_sg(const Args& a, const SgPos& g);

template <int Kind>
__global__ void __launch_bounds__(kThreads, kMinBlocks) warp_kernel(const Args a) {
  const int S = a.f.S, O = S / 8;
  SgPos g;
  g.t = int(threadIdx.x) & (O - 1);  // this thread's octet: elements [8t, 8t + 8)
  const int64_t w = a.w0 + (int64_t(blockIdx.x) * kThreads + int64_t(threadIdx.x)) / O;
  g.live = w < a.w1;
  g.w = g.live ? w : a.w1 - 1;
  g.src = a.p.order ? a.p.order[g.w] : g.w;
  g.B = a.p.bits[g.src];
  const int64_t rest = a.p.numel - g.src * S - 8 * g.t;
  g.n = rest < 0 ? 0 : rest < 8 ? int(rest) : 8;
  g.wire = a.p.wire_offset[g.w] - a.p.wire_offset[a.w0];
  warp_sg<Kind>(a, g);
}

template <int Kind>
DQ_DEVICE void warp_sg(const Args& a, const SgPos& g) {
  const DynamiqFormat& f = a.f;
  const int S = f.S, O = S / 8, gl = f.s / 8;
  const int t = g.t, n = g.n, B = g.B;
  const int64_t src = g.src, wire = g.wire, wl = g.w;
  const bool live = g.live;
  Oct x;
  if constexpr (Kind != kDecompress) load_local(a, wl, src, 8 * t, n, x);
  if constexpr (Kind != kCompress) {
    decode_octet<Kind != kDecompress>(a, B, a.in + wire, t, x);
    if constexpr (Kind == kFused || Kind == kDecAcc) {
DQ_UNROLL
      for (int e = 0; e < 8; ++e)
        if (e >= n) x.v[e] = 0.0f;  // zero padding
    }
  }
  if constexpr (Kind == kDecompress || Kind == kDecAccOut) {
    if (live) store_output(a, src, src * S + 8 * t, n, x);  // (the first n values only)
  } else if constexpr (Kind == kDecAcc) {
    if (live) octet::store_floats(a.acc + (wl - a.w0) * S + 8 * t, x);
  } else {
    uint8_t* out_sg = a.out + wire;
    // group maxima (gl lanes) and the SG maximum (O lanes), on the bit patterns
    uint32_t gb = 0;
DQ_UNROLL
    for (int e = 0; e < 8; ++e) gb = umax(gb, f32_bits(x.v[e]) & 0x7fffffffu);
    for (int d = 1; d < gl; d <<= 1) gb = umax(gb, shfl_xor(gb, d));
    uint32_t mb = gb;
    for (int d = gl; d < O; d <<= 1) mb = umax(mb, shfl_xor(mb, d));
    // The planar packing: code byte q holds elements q, q + nb, q + 2 nb, ...
    // (nb = S B / 8), so the P = 8 / B octets t = r + j nbq (j < P, nbq = nb / 8)
    // share the code bytes [8 r, 8 r + 8), octet j's codes shifted by j B.
    const int nbq = B <= 8 ? O * B / 8 : 1;
    const int j = t / nbq;
    uint64_t X = 0;
    if (B <= 8) {
      const float iv = warp_scales(a, src, t, gb, mb, out_sg, live);
      Philox4x32 vr;
      Oct pi, inv;
DQ_UNROLL
      for (int e = 0; e < 8; ++e) inv.v[e] = iv;
      draw_octet(a.rd, src, S, t, vr, pi);
      X = encode_octet(a, B, x, inv, vr, pi, j * B);
    } else if (live) {
      uint64_t h0, h1;
      bf16_octet(x, h0, h1);
      octet::store_bytes(out_sg + 16 * t, h0, 8);
      octet::store_bytes(out_sg + 16 * t + 8, h1, 8);
    }
    // log2(P) exchanges between lanes t and t ^ (nbq << s) halve what each
    // holds, OR-ing the partner's codes into the half kept: lane t ends with
    // the B bytes at 8 r + B j. Lanes of a width that needs fewer exchanges
    // (B = 8, 16) exchange with themselves.
    const int p = B == 1 ? 3 : B == 2 ? 2 : B == 4 ? 1 : 0;
    const int stages = O == 32 ? p : 3;  // one team per warp: its own width's stages
    for (int st = stages - 1; st >= 0; --st) {
      const bool act = st < p;
      const int hb = act ? 8 * (B << st) : 32;  // bits kept (at most 32)
      const bool upper = (j >> st) & 1;
      const uint64_t lowbits = X & ((uint64_t(1) << hb) - 1);
      const uint32_t got = shfl_xor(uint32_t(upper ? lowbits : X >> hb), act ? nbq << st : 0);
      if (act) X = (upper ? X >> hb : lowbits) | got;
    }
    if (live && B <= 8) octet::store_bytes(out_sg + dynamiq_scale_bytes(B, f) + 8 * (t % nbq) + B * j, X, B);
  }
}

// ---- block path -----------------------------------------------------------------------

// Element i of the SG at sg (width B): value, or base + value when accumulate
// (fmaf, as the CPU's std::fma).
template <int B>
DQ_DEVICE float decode_elem(const uint8_t* sg, const DynamiqFormat& f, const DqTables& tb, int i, float base,
                            bool accumulate) {
  if constexpr (B == 16) {
    const float v = bf16_to_f32(load_u16(sg + 2 * i));
    return accumulate ? base + v : v;
  } else {
    const uint8_t* codes = sg + dynamiq_scale_bytes(B, f);
    const float sc = dq_read_group_scale(sg, f, tb.r255, i / f.s);
    const float d = tb.lv[dynamiq_width_index(B)].decode[dq_code_at(codes, f.S, B, i)];
    return accumulate ? fmaf(d, sc, base) : d * sc;
  }
}

template <int B, bool kAcc>
DQ_DEVICE void decode_elems(const Args& a, const uint8_t* sg, int i0, Oct& x) {
DQ_UNROLL
  for (int e = 0; e < 8; ++e) x.v[e] = decode_elem<B>(sg, a.f, a.tb, i0 + e, x.v[e], kAcc);
}

// The codes of octet o of the block's tile (shared; 1 / normaliser of
// element i at inv[i / s]) into codes[8o, 8o + 8).
template <int B>
DQ_DEVICE void block_codes(const Args& a, const float* tile, const float* inv, int o, const Philox4x32& vr,
                           const Oct& pi, uint8_t* codes) {
  const DqRounding& rd = a.rd;
  const DqLevels& lv = a.tb.lv[dynamiq_width_index(B)];
DQ_UNROLL
  for (int e = 0; e < 8; ++e) {
    const int i = 8 * o + e;
    const uint32_t w = rd.stochastic ? dq_octet_word(vr, e) : 0u;
    uint32_t c;
    if constexpr (B == 1)
      c = dq_encode_sign(tile[i], inv[i / a.f.s], pi.v[e], w, rd);
    else
      c = dq_encode_value<B>(lv, tile[i], inv[i / a.f.s], pi.v[e], w, rd);
    codes[i] = uint8_t(c);
  }
}

// Encodes the block's tile (shared) into out with width B; the CPU's
// encode_sg step by step.
DQ_DEVICE void encode_block(const Args& a, int B, int64_t src, const float* tile, uint32_t* gm, float* inv,
                            uint8_t* codes, uint8_t* out) {
  const DynamiqFormat& f = a.f;
  const int S = f.S, s = f.s, G = S / s, O = S / 8;
  if (B == 16) {
    for (int o = threadIdx.x; o < O; o += blockDim.x) {
      Oct x;
DQ_UNROLL
      for (int e = 0; e < 8; ++e) x.v[e] = tile[8 * o + e];
      uint64_t h0, h1;
      bf16_octet(x, h0, h1);
      octet::store_bytes(out + 16 * o, h0, 8);
      octet::store_bytes(out + 16 * o + 8, h1, 8);
    }
    return;
  }
  for (int k = threadIdx.x; k < G; k += blockDim.x) gm[k] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < S; i += blockDim.x) atomicMax(&gm[i / s], f32_bits(tile[i]) & 0x7fffffffu);
  __syncthreads();
  uint32_t mbits = 0;
  for (int k = 0; k < G; ++k) mbits = umax(mbits, gm[k]);
  const bool bad = mbits >= 0x7f800000u;
  uint8_t* codes_out;
  if (f.hierarchical) {
    const uint16_t hb = bad ? uint16_t(0x7fc0u) : dq_sg_scale_bits(bits_f32(mbits));
    const float Msg = bf16_to_f32(hb);
    if (threadIdx.x == 0) store_u16(out, hb);
    for (int k = threadIdx.x; k < G; k += blockDim.x) {
      const float g = bits_f32(gm[k]);
      DqGroupScale gs{0, 0.0f, 0.0f};
      if (!bad) {
        gs = a.stochastic_scales
                 ? dq_group_scale_stochastic(g, Msg, a.tb.r255, dq_group_word(a.rd.key, a.rd.rank, src, G, k))
                 : dq_group_scale_up(g, Msg, a.tb.r255);
      }
      out[2 + k] = gs.r;
      inv[k] = gs.inv;
    }
    codes_out = out + 2 + G;
  } else {
    for (int k = threadIdx.x; k < G; k += blockDim.x) {
      uint16_t hb;
      DqGroupScale gs = dq_group_scale_flat(bits_f32(gm[k]), hb);
      if (bad) {
        hb = 0x7fc0u;
        gs.inv = 0.0f;
      }
      store_u16(out + 2 * k, hb);
      inv[k] = gs.inv;
    }
    codes_out = out + 2 * G;
  }
  __syncthreads();
  for (int o = threadIdx.x; o < O; o += blockDim.x) {
    Philox4x32 vr;
    Oct pi;
    draw_octet(a.rd, src, S, o, vr, pi);
    switch (B) {
      case 1: block_codes<1>(a, tile, inv, o, vr, pi, codes); break;
      case 2: block_codes<2>(a, tile, inv, o, vr, pi, codes); break;
      case 4: block_codes<4>(a, tile, inv, o, vr, pi, codes); break;
      default: block_codes<8>(a, tile, inv, o, vr, pi, codes); break;
    }
  }
  __syncthreads();
  const int P = 8 / B, nb = S / P;
  for (int k = threadIdx.x; k < nb; k += blockDim.x) {
    uint32_t byte = 0;
    for (int j = 0; j < P; ++j) byte |= uint32_t(codes[k + j * nb]) << (j * B);
    codes_out[k] = uint8_t(byte);
  }
}

template <int Kind>
__global__ void __launch_bounds__(kThreads, kMinBlocks) block_kernel(const Args a) {
  DQ_DYNAMIC_SMEM(smem);
  const DynamiqFormat& f = a.f;
  const int S = f.S, G = S / f.s, O = S / 8;
  float* tile = reinterpret_cast<float*>(smem);
  uint32_t* gm = reinterpret_cast<uint32_t*>(tile + S);
  float* inv = reinterpret_cast<float*>(gm + G);
  uint8_t* codes = reinterpret_cast<uint8_t*>(inv + G);
  const int64_t w = a.w0 + blockIdx.x;
  const int64_t src = a.p.order ? a.p.order[w] : w;
  const int B = a.p.bits[src];
  const int64_t wire = a.p.wire_offset[w] - a.p.wire_offset[a.w0];
  const int64_t rest = a.p.numel - src * S;
  const int cnt = rest < S ? int(rest) : S;
  for (int o = threadIdx.x; o < O; o += blockDim.x) {
    const int i0 = 8 * o;
    const int n = cnt - i0 < 0 ? 0 : cnt - i0 < 8 ? cnt - i0 : 8;
    Oct x;
    if constexpr (Kind != kDecompress) load_local(a, w, src, i0, n, x);
    if constexpr (Kind == kFused) {
      // through the tile, an element at a time: the fused kernel's encode
      // holds enough registers already
DQ_UNROLL
      for (int e = 0; e < 8; ++e) tile[i0 + e] = x.v[e];
DQ_NO_UNROLL
      for (int e = 0; e < 8; ++e) {
        float v = 0.0f;
        switch (B) {
          case 1: v = decode_elem<1>(a.in + wire, f, a.tb, i0 + e, tile[i0 + e], true); break;
          case 2: v = decode_elem<2>(a.in + wire, f, a.tb, i0 + e, tile[i0 + e], true); break;
          case 4: v = decode_elem<4>(a.in + wire, f, a.tb, i0 + e, tile[i0 + e], true); break;
          case 8: v = decode_elem<8>(a.in + wire, f, a.tb, i0 + e, tile[i0 + e], true); break;
          default: v = decode_elem<16>(a.in + wire, f, a.tb, i0 + e, tile[i0 + e], true); break;
        }
        tile[i0 + e] = e < n ? v : 0.0f;  // zero padding
      }
      continue;
    }
    if constexpr (Kind != kCompress) {
      constexpr bool kAcc = Kind != kDecompress;
      const uint8_t* sg = a.in + wire;
      switch (B) {
        case 1: decode_elems<1, kAcc>(a, sg, i0, x); break;
        case 2: decode_elems<2, kAcc>(a, sg, i0, x); break;
        case 4: decode_elems<4, kAcc>(a, sg, i0, x); break;
        case 8: decode_elems<8, kAcc>(a, sg, i0, x); break;
        default: decode_elems<16, kAcc>(a, sg, i0, x); break;
      }
      if constexpr (Kind == kDecAcc) {
DQ_UNROLL
        for (int e = 0; e < 8; ++e)
          if (e >= n) x.v[e] = 0.0f;  // zero padding
      }
    }
    if constexpr (Kind == kDecompress || Kind == kDecAccOut) {
      store_output(a, src, src * S + i0, n, x);
    } else if constexpr (Kind == kDecAcc) {
      octet::store_floats(a.acc + (w - a.w0) * S + i0, x);
    } else {
DQ_UNROLL
      for (int e = 0; e < 8; ++e) tile[i0 + e] = x.v[e];
    }
  }
  if constexpr (Kind == kCompress || Kind == kFused) {
    __syncthreads();
    encode_block(a, B, src, tile, gm, inv, codes, a.out + wire);
  }
}

// ---- statistics ---------------------------------------------------------------------

// kStatUnitsPerBlock super-groups per block of kStatLanes * kStatUnitsPerBlock
// threads: kStatLanes consecutive lanes per super-group, each summing the same
// elements in the same order as the CPU pass (dynamiq_stats.h), combined by
// xor shuffles in dq_combine_lanes' order (a + b and b + a are the same
// bits), so the statistics are bit-identical to it.
constexpr int kStatUnitsPerBlock = 32;

__global__ void __launch_bounds__(kStatLanes * kStatUnitsPerBlock) stats_kernel(const void* data, DType dt,
                                                                               int64_t numel, int32_t S,
                                                                               float* out, uint32_t* nonfinite) {
  const int j = int(threadIdx.x) / kStatLanes;  // super-group of the block
  const int l = int(threadIdx.x) % kStatLanes;  // lane
  const int64_t u = int64_t(blockIdx.x) * kStatUnitsPerBlock + j;
  const int64_t e0 = u * S;
  const int64_t c = e0 >= numel ? 0 : numel - e0 < S ? numel - e0 : S;
  double ls = 0.0, lq = 0.0;
  uint32_t bad = 0;
  for (int64_t i = l; i < c; i += kStatLanes) {
    const float f = dt == DType::kF32 ? static_cast<const float*>(data)[e0 + i]
                                      : octet::half_to_f32(dt, static_cast<const uint16_t*>(data)[e0 + i]);
    const double v = double(f);
    ls += v;
    lq += v * v;
    bad |= DTypeTraits<DType::kF32>::nonfinite(f);  // (the conversion keeps inf and nan)
  }
  if (bad) atomicOr(nonfinite, 1u);
  static_assert(kStatLanes == 8, "dq_combine_lanes combines 8 lanes");
  for (int d = 1; d < kStatLanes; d <<= 1) {
    ls += shfl_xor(ls, d);
    lq += shfl_xor(lq, d);
  }
  if (l == 0 && c > 0) {
    out[2 * u] = dq_saturate(ls / double(c));
    out[2 * u + 1] = dq_saturate(lq);
  }
}

int launch(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const DeviceLocal& x,
           int64_t w0, int64_t w1, const DqRounding& rd, const uint8_t* in, uint8_t* out,
           float* acc, const DeviceOutput& y, int kind, void* stream) {
  if (w1 <= w0) return 0;
  if (prm.fmt.S > kMaxS || p.unit != prm.fmt.S) return int(cudaErrorInvalidValue);
  const Args a{prm.fmt, prm.stochastic_group_scales, tb, p, x, w0, w1, rd, in, out, acc, y, exact_reciprocal(y.divisor)};
  const auto st = static_cast<cudaStream_t>(stream);
  const int S = prm.fmt.S;
  if (warp_path(prm.fmt)) {
    const int64_t per_block = kThreads / (S / 8);
    const unsigned blocks = unsigned(ceil_div<int64_t>(w1 - w0, per_block));
    switch (kind) {
      case kCompress: DQ_LAUNCH(warp_kernel<kCompress>, blocks, kThreads, 0, st)(a); break;
      case kFused: DQ_LAUNCH(warp_kernel<kFused>, blocks, kThreads, 0, st)(a); break;
      case kDecAcc: DQ_LAUNCH(warp_kernel<kDecAcc>, blocks, kThreads, 0, st)(a); break;
      case kDecAccOut: DQ_LAUNCH(warp_kernel<kDecAccOut>, blocks, kThreads, 0, st)(a); break;
      default: DQ_LAUNCH(warp_kernel<kDecompress>, blocks, kThreads, 0, st)(a); break;
    }
  } else {
    const size_t smem = shared_bytes(prm.fmt);
    const int O = S / 8;
    const unsigned threads = unsigned(O <= 32 ? 32 : O < kThreads ? (O + 31) / 32 * 32 : kThreads);
    const unsigned blocks = unsigned(w1 - w0);
    switch (kind) {
      case kCompress: DQ_LAUNCH(block_kernel<kCompress>, blocks, threads, smem, st)(a); break;
      case kFused: DQ_LAUNCH(block_kernel<kFused>, blocks, threads, smem, st)(a); break;
      case kDecAcc: DQ_LAUNCH(block_kernel<kDecAcc>, blocks, threads, smem, st)(a); break;
      case kDecAccOut: DQ_LAUNCH(block_kernel<kDecAccOut>, blocks, threads, smem, st)(a); break;
      default: DQ_LAUNCH(block_kernel<kDecompress>, blocks, threads, smem, st)(a); break;
    }
  }
  return int(cudaGetLastError());
}

}  // namespace

std::string unsupported(const DynamiqParams& prm) {
  const DynamiqFormat& f = prm.fmt;
  if (f.S > kMaxS)
    return "the CUDA kernels take super-groups of at most " + std::to_string(kMaxS) + " elements (supergroup_size=" +
           std::to_string(f.S) + ")";
  if (f.s < 1 || f.S % f.s != 0) return "group size must divide the super-group size";
  if (shared_bytes(f) > kMaxSharedBytes)
    return "supergroup_size=" + std::to_string(f.S) + " with group_size=" + std::to_string(f.s) + " needs " +
           std::to_string(shared_bytes(f)) + " bytes of shared memory per block, over the " +
           std::to_string(kMaxSharedBytes) + " a CUDA kernel gets (use larger groups or smaller super-groups)";
  return "";
}

// ---- tables ----------------------------------------------------------------------

DeviceTables::DeviceTables(const DynamiqTables& tables, void* stream) : stream_(stream) {
  const auto& img = tables.image();
  // On the kernels' stream (ordered before them), not waited for: the host
  // image lives as long as the codec that owns these tables (the host codec
  // of a CudaCodec), and a copy from pageable memory has read it when it returns.
  const auto st = static_cast<cudaStream_t>(stream_);
  image_ = static_cast<uint8_t*>(device_alloc(img.size(), st));
  if (cudaMemcpyAsync(image_, img.data(), img.size(), cudaMemcpyHostToDevice, st) != cudaSuccess) {
    device_free(image_, st);
    throw Error("dynamiq cuda: cannot upload the level tables");
  }
  view_ = tables.rebased(image_);
}

DeviceTables::~DeviceTables() {
  const auto st = static_cast<cudaStream_t>(stream_);
  device_free(image_, st);
  for (auto& kv : columns_) device_free(kv.second, st);
}

DqRounding DeviceTables::rounding(const RngCtx& rng) {
  DqRounding rd = make_dynamiq_rounding(rng);  // host column
  if (rd.correlated && rd.perm.column) {
    const auto key = std::make_pair(int(rd.perm.n), int(rd.perm.rank));
    int32_t*& dev = columns_[key];
    if (!dev) {
      const size_t bytes = size_t(rd.perm.nfact) * sizeof(int32_t);
      const auto st = static_cast<cudaStream_t>(stream_);
      dev = static_cast<int32_t*>(device_alloc(bytes, st));
      // not waited for: ordered before the kernels (pageable source, read at the call)
      if (cudaMemcpyAsync(dev, rd.perm.column, bytes, cudaMemcpyHostToDevice, st) != cudaSuccess) {
        device_free(dev, st);
        dev = nullptr;
        throw Error("dynamiq cuda: cannot upload the permutation table");
      }
    }
    rd.perm.column = dev;
  }
  return rd;
}

// ---- launchers -------------------------------------------------------------------

int stats(const void* data, DType dtype, int64_t numel, int32_t S, float* out, uint32_t* nonfinite,
          void* stream) {
  if (numel <= 0) return 0;
  if (S < 1) return int(cudaErrorInvalidValue);
  const int64_t units = ceil_div<int64_t>(numel, S);
  const unsigned blocks = unsigned(ceil_div<int64_t>(units, kStatUnitsPerBlock));
  DQ_LAUNCH(stats_kernel, blocks, kStatLanes * kStatUnitsPerBlock, 0, static_cast<cudaStream_t>(stream))(
      data, dtype, numel, S, out, nonfinite);
  return int(cudaGetLastError());
}

int compress(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const DeviceLocal& x,
             int64_t w0, int64_t w1, const DqRounding& rd, uint8_t* out, void* stream) {
  return launch(prm, tb, p, x, w0, w1, rd, nullptr, out, nullptr, DeviceOutput(), kCompress, stream);
}

int decompress(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const uint8_t* in,
               int64_t w0, int64_t w1, const DeviceOutput& y, void* stream) {
  return launch(prm, tb, p, DeviceLocal(), w0, w1, DqRounding(), in, nullptr, nullptr, y, kDecompress,
                stream);
}

int decompress_accumulate(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p,
                          const uint8_t* in, const DeviceLocal& x, int64_t w0, int64_t w1,
                          float* acc, void* stream) {
  return launch(prm, tb, p, x, w0, w1, DqRounding(), in, nullptr, acc, DeviceOutput(), kDecAcc, stream);
}

int decompress_accumulate_recompress(const DynamiqParams& prm, const DqTables& tb,
                                     const DevicePlan& p, const uint8_t* in, const DeviceLocal& x,
                                     int64_t w0, int64_t w1, const DqRounding& rd, uint8_t* out,
                                     void* stream) {
  return launch(prm, tb, p, x, w0, w1, rd, in, out, nullptr, DeviceOutput(), kFused, stream);
}

int decompress_accumulate_output(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p,
                                 const uint8_t* in, const DeviceLocal& x, int64_t w0, int64_t w1,
                                 const DeviceOutput& y, void* stream) {
  return launch(prm, tb, p, x, w0, w1, DqRounding(), in, nullptr, nullptr, y, kDecAccOut, stream);
}

}  // namespace cuda
}  // namespace dynamiq
