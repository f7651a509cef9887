// Which element-to-thread layout the DynamiQ CUDA compress kernel should have,
// from the compiler's output (never run; compile to SASS and count):
//   nvcc -arch=sm_90 -cubin --fmad=false -std=c++20 -O3 -Icsrc -Xptxas -v experiments/probes/dynamiq_layout_sass.cu -o /tmp/layout.cubin
//   cuobjdump -sass /tmp/layout.cubin | python3 experiments/probes/sass_counts.py -
// Two compress kernels for the default format only (fp32, S = 256, s = 16,
// width 4, round-up group scales, stochastic independent rounding: the
// per-element functions of dynamiq_math.h), one warp per super-group, each
// thread 8 values and one Philox call:
//  - octet:   thread t takes elements 8t .. 8t + 7 (the layout adopted:
//             README.md, "Randomness"): two 16-byte loads, its 8 values in one
//             group (one group scale), the planar code bytes assembled by one
//             shuffle exchange;
//  - strided: thread k takes elements k, k + 32, ..., k + 224 (the previous
//             layout: call k rounded them): 8 coalesced 4-byte loads, its
//             values in 8 groups (8 group scales, each group's maximum a
//             4-step shuffle reduction over 16 lanes), the code bytes its own.
// Both are straight-line per thread, so instructions per thread / 8 is the
// instructions per value.
#include <cuda_runtime.h>

#include "kernels/dynamiq/dynamiq_math.h"

namespace dynamiq {

struct LayoutArgs {
  const float* x;   // 256 * nsg values
  uint8_t* out;     // 146 bytes per SG (width 4)
  DqLevels lv;      // width 4
  const float* r255;
  DqRounding rd;
};

constexpr int kS = 256, kSmall = 16, kG = kS / kSmall, kB = 4, kBytes = 2 + kG + kS * kB / 8;

__device__ __forceinline__ uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

__global__ void __launch_bounds__(256) compress_octet(const LayoutArgs a) {
  const int t = threadIdx.x & 31;
  const int64_t sg = (int64_t(blockIdx.x) * 256 + threadIdx.x) / 32;
  const float4 lo = reinterpret_cast<const float4*>(a.x + sg * kS + 8 * t)[0];
  const float4 hi = reinterpret_cast<const float4*>(a.x + sg * kS + 8 * t)[1];
  const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  uint32_t gb = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) gb = umax(gb, f32_bits(x[e]) & 0x7fffffffu);
  gb = umax(gb, __shfl_xor_sync(~0u, gb, 1));  // group of 16 = 2 lanes
  uint32_t mb = gb;
#pragma unroll
  for (int d = 2; d < 32; d <<= 1) mb = umax(mb, __shfl_xor_sync(~0u, mb, d));
  const uint16_t hb = dq_sg_scale_bits(bits_f32(mb));
  const float Msg = bf16_to_f32(hb);
  uint8_t* out = a.out + sg * kBytes;
  const DqGroupScale gs = dq_group_scale_up(bits_f32(gb), Msg, a.r255);
  if (t == 0) out[0] = uint8_t(hb), out[1] = uint8_t(hb >> 8);
  if (t % 2 == 0) out[2 + t / 2] = gs.r;
  const Philox4x32 vr = dq_draw(a.rd.key, uint64_t(sg) * 32 + t, kPurposeValue, a.rd.rank);
  // codes in byte slots; octets t and t + 16 share the code bytes [8 (t % 16), + 8)
  uint64_t X = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e)
    X |= uint64_t(dq_encode_value<kB>(a.lv, x[e], gs.inv, 0.0f, dq_octet_word(vr, e), a.rd)) << (8 * e + (t / 16) * 4);
  const bool upper = t >= 16;
  const uint32_t got = __shfl_xor_sync(~0u, uint32_t(upper ? X : X >> 32), 16);
  const uint32_t mine = uint32_t(upper ? X >> 32 : X) | got;
  uint8_t* codes = out + 2 + kG + 8 * (t % 16) + 4 * (t / 16);
#pragma unroll
  for (int k = 0; k < 4; ++k) codes[k] = uint8_t(mine >> (8 * k));  // the wire is byte-aligned
}

__global__ void __launch_bounds__(256) compress_strided(const LayoutArgs a) {
  const int k = threadIdx.x & 31;
  const int64_t sg = (int64_t(blockIdx.x) * 256 + threadIdx.x) / 32;
  float x[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = a.x[sg * kS + k + 32 * e];
  // element k + 32 e is in group 2 e + k / 16: 8 maxima over 16 lanes each
  uint32_t g[8], mb = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    g[e] = f32_bits(x[e]) & 0x7fffffffu;
#pragma unroll
    for (int d = 1; d < 16; d <<= 1) g[e] = umax(g[e], __shfl_xor_sync(~0u, g[e], d));
    mb = umax(mb, g[e]);
  }
  mb = umax(mb, __shfl_xor_sync(~0u, mb, 16));
  const uint16_t hb = dq_sg_scale_bits(bits_f32(mb));
  const float Msg = bf16_to_f32(hb);
  uint8_t* out = a.out + sg * kBytes;
  if (k == 0) out[0] = uint8_t(hb), out[1] = uint8_t(hb >> 8);
  const Philox4x32 vr = dq_draw(a.rd.key, uint64_t(sg) * 32 + k, kPurposeValue, a.rd.rank);
  uint32_t c[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const DqGroupScale gs = dq_group_scale_up(bits_f32(g[e]), Msg, a.r255);
    if (k % 16 == 0) out[2 + 2 * e + k / 16] = gs.r;
    c[e] = dq_encode_value<kB>(a.lv, x[e], gs.inv, 0.0f, dq_octet_word(vr, e), a.rd);
  }
  // planar bytes: byte k + 32 m holds elements k + 32 m (low) and k + 32 (m + 4) (high)
#pragma unroll
  for (int m = 0; m < 4; ++m) out[2 + kG + k + 32 * m] = uint8_t(c[m] | (c[m + 4] << 4));
}

}  // namespace dynamiq
