// bf16/fp16 conversions of float_bits.h against independent oracles:
//  - fp16: gcc's _Float16 (hardware F16C conversion, IEEE round-to-nearest-even;
//    on aarch64, where gcc 12 has no _Float16 in C++, the Arm __fp16 type,
//    converted by FCVT with the same rounding);
//  - bf16: a reference written with double arithmetic (round to nearest even
//    by comparing the distances to the two neighbouring bf16 values).
// Every 16-bit pattern is checked exhaustively in the 16 -> 32 direction; in
// the 32 -> 16 direction every float whose low 16 bits come from a set that
// covers all rounding cases (0, 1, half-1, half, half+1, max, and a stride)
// is checked, for all 2^16 high halves: 2^16 x 40 patterns (all the
// ties/near-ties of both formats: their rounding bit lies in the low 16 bits
// for bf16, and in bits 12..0 plus the stride for fp16). FloatBitsSweep then
// checks every 5th of all 2^32 float bit patterns (859 million, every low
// half and every high half occurs) against both oracles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/base/float_bits.h"

#if defined(__SSE__)
#include <immintrin.h>
#endif

namespace dynamiq {
namespace {

#if defined(__aarch64__)
using Half = __fp16;
#else
using Half = _Float16;
#endif

bool is_nan_bits32(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// bf16 reference: nearest even, via exact double comparisons.
uint16_t ref_f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (is_nan_bits32(u)) return uint16_t((u >> 16) | 0x40u);
  const uint16_t lo = uint16_t(u >> 16);  // truncation toward zero
  if ((u & 0xffffu) == 0) return lo;
  const uint16_t hi = uint16_t(lo + 1);   // next bf16 away from zero
  auto val = [](uint16_t h) {
    uint32_t b = uint32_t(h) << 16;
    float r;
    std::memcpy(&r, &b, 4);
    return double(r);
  };
  const double x = double(f), a = val(lo);
  // the neighbour away from zero may be inf: its "value" for rounding is 2^128
  double b = ((hi & 0x7fffu) == 0x7f80u) ? std::copysign(std::ldexp(1.0, 128), x) : val(hi);
  const double da = std::fabs(x - a), db = std::fabs(b - x);
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1u) ? hi : lo;
}

std::vector<uint32_t> low_patterns() {
  std::vector<uint32_t> v = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x0fff, 0x1000,
                             0x1001, 0x0800, 0x07ff, 0x0801, 0x17ff, 0x1800, 0x1801, 0x2000,
                             0x3000, 0xf000, 0xe800, 0x5555, 0xaaaa, 0x0fff, 0x1fff, 0x2fff};
  for (uint32_t k = 0; k < 16; ++k) v.push_back(k * 0x1000u + 0x0123u);
  return v;
}

TEST(FloatBits, Bf16ToF32ExhaustiveIsAShift) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    ASSERT_EQ(u, h << 16);
  }
}

TEST(FloatBits, F16ToF32ExhaustiveMatchesFloat16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    Half x;
    const uint16_t hh = uint16_t(h);
    std::memcpy(&x, &hh, 2);
    const float want = float(x);
    const float got = f16_to_f32_portable(hh);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    uint32_t a, b;
    std::memcpy(&a, &want, 4);
    std::memcpy(&b, &got, 4);
    ASSERT_EQ(a, b) << std::hex << h;
  }
}

TEST(FloatBits, F32ToBf16MatchesReferenceOnAllRoundingCases) {
  const auto lows = low_patterns();
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : lows) {
      const uint32_t u = (hi << 16) | lo;
      const float f = bits_f32(u);
      const uint16_t got = f32_to_bf16(f), want = ref_f32_to_bf16(f);
      ASSERT_EQ(got, want) << std::hex << u;
    }
}

TEST(FloatBits, F32ToF16MatchesFloat16OnAllRoundingCases) {
  const auto lows = low_patterns();
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : lows) {
      const uint32_t u = (hi << 16) | lo;
      const float f = bits_f32(u);
      const Half h = Half(f);
      uint16_t want;
      std::memcpy(&want, &h, 2);
      const uint16_t got = f32_to_f16_portable(f);
      if (is_nan_bits32(u)) {
        ASSERT_EQ(got & 0x7c00u, 0x7c00u);
        ASSERT_NE(got & 0x03ffu, 0u);
        continue;
      }
      ASSERT_EQ(got, want) << std::hex << u;
    }
}

TEST(FloatBits, Bf16CeilIsTheSmallestBf16NotBelow) {
  // For every positive finite float with the listed low halves: ceil(f) >= f
  // and the bf16 just below it is < f.
  const auto lows = low_patterns();
  for (uint32_t hi = 0; hi < 0x7f80u; ++hi)
    for (uint32_t lo : lows) {
      const float f = bits_f32((hi << 16) | lo);
      const uint16_t c = f32_to_bf16_ceil_pos(f);
      const double cv = (c == 0x7f80u) ? INFINITY : double(bf16_to_f32(c));
      ASSERT_GE(cv, double(f)) << std::hex << ((hi << 16) | lo);
      if (c > 0) {
        ASSERT_LT(double(bf16_to_f32(uint16_t(c - 1))), double(f));
      }
    }
}

constexpr uint64_t kSweepStride = 5;

TEST(FloatBitsSweep, F32ToF16EveryFifthPattern) {
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += kSweepStride) {
    const uint32_t b = uint32_t(u);
    if (is_nan_bits32(b)) continue;
    const float f = bits_f32(b);
    const Half h = Half(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    mismatches += f32_to_f16_portable(f) != want;
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(FloatBitsSweep, F32ToBf16EveryFifthPatternAgainstDoubleRounding) {
  // Second, differently written reference: round the float (exact in double)
  // to bf16 precision by adding and subtracting a power-of-two "magic"
  // constant in double (the addition rounds to nearest even).
  double magic_of[256];
  for (int ex = 0; ex < 256; ++ex) magic_of[ex] = std::ldexp(1.0, (ex == 0 ? -126 : ex - 127) - 7 + 52);
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += kSweepStride) {
    const uint32_t b = uint32_t(u);
    if (is_nan_bits32(b)) continue;
    const uint16_t got = f32_to_bf16(bits_f32(b));
    const uint32_t exp = (b >> 23) & 0xffu;
    if (exp == 0xffu) {  // inf
      mismatches += got != uint16_t(b >> 16);
      continue;
    }
    const double ax = std::fabs(double(bits_f32(b)));
    const double magic = magic_of[exp];  // doubles near it are spaced one bf16 ulp apart
    const double r = (ax + magic) - magic;
    const uint16_t sign = uint16_t((b & 0x80000000u) >> 16);
    uint16_t want;
    if (r >= 0x1p128) {
      want = uint16_t(sign | 0x7f80u);
    } else {
      const float rf = float(r);  // exact: r has at most 8 significant bits
      uint32_t rb;
      std::memcpy(&rb, &rf, 4);
      want = uint16_t(sign | (rb >> 16));
    }
    mismatches += got != want;
  }
  EXPECT_EQ(mismatches, 0u);
}

// The host fp16 conversions (F16C instructions on x86-64-v3) against the
// portable ones the CUDA device code uses (checked against the oracles above):
// bit for bit, NaN payloads included, every 16-bit pattern and every float
// with the rounding-case low halves, also with flush-to-zero and
// denormals-are-zero set (as torch.set_flush_denormal(True) does).
void expect_f16_host_matches_portable() {
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(f32_bits(f16_to_f32(uint16_t(h))), f32_bits(f16_to_f32_portable(uint16_t(h)))) << std::hex << h;
  const auto lows = low_patterns();
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : lows) {
      const float f = bits_f32((hi << 16) | lo);
      ASSERT_EQ(f32_to_f16(f), f32_to_f16_portable(f)) << std::hex << ((hi << 16) | lo);
    }
}

TEST(FloatBits, F16HostConversionsMatchThePortableOnes) { expect_f16_host_matches_portable(); }

#if defined(__SSE__)
TEST(FloatBits, F16HostConversionsMatchThePortableOnesUnderFtzDaz) {
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
  expect_f16_host_matches_portable();
  _mm_setcsr(csr);
}
#endif

// exact_reciprocal: nonzero exactly for positive normal powers of two, and
// there v * r is bit-identical to v / d (what the store paths rely on) for
// every sign and exponent of v, denormals, zeros, infinities and NaN included.
TEST(FloatBits, ExactReciprocalOnlyForPowersOfTwoAndThenEqualToDivision) {
  for (float d : {3.0f, 5.0f, 6.0f, 12.0f, 1.5f, 0.75f, 0.0f, -2.0f, -4.0f, 1e-45f, INFINITY, NAN})
    EXPECT_EQ(exact_reciprocal(d), 0.0f) << d;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  size_t mismatches = 0, checked = 0;
  for (int k = -126; k <= 127; ++k) {
    const float d = std::ldexp(1.0f, k);
    const float r = exact_reciprocal(d);
    ASSERT_NE(r, 0.0f) << "2^" << k;
    for (int i = 0; i < 4000; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      // the special values first (zeros, denormals, smallest normal, one,
      // largest finite, infinities, a NaN), then random bit patterns
      constexpr uint32_t kSpecial[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
                                       0x00800000u, 0x3f800000u, 0x7f7fffffu, 0x7f800000u,
                                       0xff800000u, 0x7fc00001u};
      constexpr int kNumSpecial = int(sizeof(kSpecial) / sizeof(kSpecial[0]));
      const uint32_t vb = i < kNumSpecial ? kSpecial[i] : uint32_t(x >> 32);
      const float v = bits_f32(vb);
      const float a = v * r, b = v / d;
      if (std::isnan(b)) {
        mismatches += !std::isnan(a);
      } else {
        mismatches += f32_bits(a) != f32_bits(b);
      }
      ++checked;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << checked;
}

}  // namespace
}  // namespace dynamiq
