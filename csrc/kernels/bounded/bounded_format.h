// Mode "bounded": error-bounded lossy compression after ZCCL's customised
// fZ-light (ZCCL sections 3.3 and 3.5). The wire format and the per-value
// math, shared by the CPU codec (bounded_codec.cc) and any device port.
//
// ---- Quantisation -------------------------------------------------------------------
// e > 0 is the absolute error bound of one compression, w = 2e the bin width.
// A value x becomes the bin index q (|q| <= kBoundedQMax) and is decoded as
//     y(q) = float(q) * w          (one IEEE float multiply, never fused)
// The encoder takes q = rint(x / w), then checks |x - y(q)| <= e with the
// decoder's own arithmetic (exactly, in double); if that fails (float
// rounding at a bin edge) it tries the neighbour towards x. A value with no
// valid q (|x / w| above kBoundedQMax, inf, nan, or a bound too fine for the
// float grid) sends its whole 32-value code block raw: float32 bits, exact.
// x == 0 always gives q = 0, so e = 0 still codes zero blocks in one byte.
// So every decoded value is within e of the value that was compressed.
//
// ---- Prediction and packing ------------------------------------------------------------
// The bin indices of a plan unit (at most kBoundedMaxUnit values) are coded
// as one 1-D Lorenzo chain in code blocks of 32 values: the residual of a
// value is q - q_prev, q_prev the previous coded value of the unit; the
// chain starts at the unit's anchor (int32, the q of the first value of the
// first non-raw code block, 0 if none), so that value's residual is 0. A raw
// code block leaves q_prev unchanged. Residuals are zigzag-mapped
// (z = 2r for r >= 0, -2r - 1 for r < 0) and packed with the block's code
// length L = bit length of the largest z: value i of the block at bits
// [iL, iL + L) of a little-endian bit stream of 4L bytes. Slots past the
// unit's last value carry z = 0.
//
// ---- Block message (units u0..u1 of the plan, nb code blocks in all) --------------------
// static part (size known from the plan):
//   0   u8  magic 0xB0
//   1   u8  version 1
//   2   u16 0
//   4   u32 bits of e (float32; must equal the plan's)
//   8   u32 dynamic part bytes
//   12  u32 number of values in the block
//   16  int32 anchor per unit
//   ..  u8 code length per code block: 0 (all residuals zero: nothing in the
//       dynamic part), 1..kBoundedMaxLen (4L bytes), kBoundedRaw (128 bytes)
// dynamic part: the code blocks' payloads in order.
#pragma once

#include "kernels/base/bytes.h"
#include "kernels/base/common.h"
#include "kernels/base/float_bits.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace dynamiq {

constexpr int kBoundedBlock = 32;                 // values per code block
constexpr int32_t kBoundedQMax = 1 << 24;         // |q| <= 2^24: float(q) is exact
constexpr int kBoundedMaxLen = 27;                // zigzag of |r| <= 2^25 fits 27 bits
constexpr uint8_t kBoundedRaw = 0xff;             // code length of a raw block
constexpr int kBoundedRawBytes = 4 * kBoundedBlock;
constexpr int kBoundedHeaderBytes = 16;
constexpr uint8_t kBoundedMagic = 0xb0;
constexpr uint8_t kBoundedVersion = 1;
constexpr int32_t kBoundedMaxUnit = 4096;         // the largest plan unit (identity_shard_unit)
// The largest accepted error bound: w = 2e stays finite.
constexpr float kBoundedMaxBound = 0x1p126f;

DQ_HD uint32_t bounded_zigzag(int32_t r) { return (uint32_t(r) << 1) ^ uint32_t(r >> 31); }
DQ_HD int32_t bounded_unzigzag(uint32_t z) { return int32_t(z >> 1) ^ -int32_t(z & 1u); }

DQ_HD int bounded_bitlen(uint32_t v) {
  int n = 0;
  while (v) {
    ++n;
    v >>= 1;
  }
  return n;
}

// The decoder's value of bin q (w = 2e). A separate multiply: the build
// forbids contraction (-ffp-contract=off, nvcc --fmad=false), so an add of
// the result is never fused with it.
DQ_HD float bounded_value(int32_t q, float w) { return float(q) * w; }

// Bin index of x, or false if x has none within e (the block goes raw).
DQ_HD bool bounded_quantize(float x, float w, float e, int32_t& q_out) {
  if (x == 0.0f) {  // also -0 and e = 0: decodes to +0, error 0
    q_out = 0;
    return true;
  }
  const float t = x / w;
  const float qmax = float(kBoundedQMax);
  if (!(t >= -qmax && t <= qmax)) return false;  // out of range, inf, nan
#if defined(__CUDA_ARCH__)
  const float r = rintf(t);
#else
  const float r = std::nearbyint(t);
#endif
  int32_t q = int32_t(r);
  // |x - y| in double is exact whenever it is near e (both are floats within
  // a few e of each other, or y = 0), so the comparison is exact there.
  const double de = double(e);
  double d = double(x) - double(bounded_value(q, w));
  if (d <= de && d >= -de) {
    q_out = q;
    return true;
  }
  const int32_t q2 = d > 0 ? q + 1 : q - 1;
  if (q2 > kBoundedQMax || q2 < -kBoundedQMax) return false;
  d = double(x) - double(bounded_value(q2, w));
  if (d <= de && d >= -de) {
    q_out = q2;
    return true;
  }
  return false;
}

// Static part of a block of `units` plan units holding `values` values and
// `code_blocks` code blocks.
DQ_HD int64_t bounded_static_bytes(int64_t units, int64_t code_blocks) {
  return kBoundedHeaderBytes + 4 * units + code_blocks;
}

// Payload bytes of a code block with code length byte L (-1: invalid byte).
DQ_HD int64_t bounded_payload_bytes(uint8_t L) {
  if (L == kBoundedRaw) return kBoundedRawBytes;
  if (L <= kBoundedMaxLen) return 4 * int64_t(L);
  return -1;
}

// Packs z[0, 32) with code length L (1..27) into 4L bytes.
DQ_HD void bounded_pack(const uint32_t* z, int L, uint8_t* out) {
  uint64_t acc = 0;
  int nbits = 0;
  int o = 0;
  for (int i = 0; i < kBoundedBlock; ++i) {
    acc |= uint64_t(z[i]) << nbits;
    nbits += L;
    while (nbits >= 8) {
      out[o++] = uint8_t(acc);
      acc >>= 8;
      nbits -= 8;
    }
  }
  // 32 L bits is a whole number of bytes: nothing left over.
}

DQ_HD void bounded_unpack(const uint8_t* in, int L, uint32_t* z) {
  const uint64_t mask = (uint64_t(1) << L) - 1;
  uint64_t acc = 0;
  int nbits = 0;
  int o = 0;
  for (int i = 0; i < kBoundedBlock; ++i) {
    while (nbits < L) {
      acc |= uint64_t(in[o++]) << nbits;
      nbits += 8;
    }
    z[i] = uint32_t(acc & mask);
    acc >>= L;
    nbits -= L;
  }
}

}  // namespace dynamiq
