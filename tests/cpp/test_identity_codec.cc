// The identity codec's element loops on 16-bit buckets (mode none's hops, and
// lossless mode's accumulate, which goes through them), against a plain
// per-element oracle built on the portable conversions (test_float_bits checks
// those against _Float16 and the bf16 definition). The 16-bit loops run 8
// lanes per vector conversion (Lanes8: F16C for fp16, AVX2 integer rounding for
// bf16) with a per-element tail: lengths around multiples of 8, blocks that
// start past element 0, and inputs of every class (denormals, infinities, NaN
// payloads, rounding ties, values beyond fp16's range) must give the oracle's
// bits exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/identity/identity_codec.h"

namespace dynamiq {
namespace {

constexpr int32_t kUnit = 64;

float to_f32(DType dt, uint16_t h) { return dt == DType::kF16 ? f16_to_f32_portable(h) : bf16_to_f32(h); }
uint16_t from_f32(DType dt, float f) { return dt == DType::kF16 ? f32_to_f16_portable(f) : f32_to_bf16(f); }

// Random 16-bit patterns: every class of value, NaNs with their payloads included.
std::vector<uint16_t> random_halves(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint16_t> v(n);
  for (auto& h : v) h = uint16_t(g());
  return v;
}

// Floats of every magnitude the accumulator can hold: fp16's normal and
// denormal range, beyond its largest finite value (overflow to inf), float
// denormals, infinities and NaNs; a share of them exactly halfway between two
// 16-bit values or one unit of the float beside.
std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> mag(-30.0f, 20.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = g() % 16;
    const float f = (g() & 1 ? -1.0f : 1.0f) * std::exp2(mag(g));
    if (k == 0) v[i] = bits_f32(g());  // any pattern (NaN, inf, float denormal too)
    // rounding ties and their neighbours: bf16's at the low 16 bits, fp16's
    // (normal range) at the low 13
    else if (k == 1) v[i] = bits_f32((f32_bits(f) & 0xffff0000u) | (0x7fffu + g() % 3));
    else if (k == 2) v[i] = bits_f32((f32_bits(f) & 0xffffe000u) | (0x0fffu + g() % 3));
    else if (k == 3) v[i] = bits_f32(0x7f800001u | (g() & 0x807fffffu));  // NaN, any sign and payload
    else v[i] = f;
  }
  return v;
}

struct Case16 {
  DType dt;
  int64_t numel;
  Block b;
  int64_t e0 = 0, n = 0;  // element range of the block
};

std::vector<Case16> cases() {
  std::vector<Case16> out;
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int64_t numel : {int64_t(1), int64_t(7), int64_t(8), int64_t(9), int64_t(64), int64_t(1003)}) {
      const int64_t units = (numel + kUnit - 1) / kUnit;
      for (int64_t w0 : {int64_t(0), units > 3 ? int64_t(3) : int64_t(0)}) {
        Case16 s{dt, numel, Block{w0, units}};
        s.e0 = w0 * kUnit;
        s.n = numel - s.e0;
        out.push_back(s);
      }
    }
  return out;
}

std::string name(const Case16& s) {
  return std::string(dtype_name(s.dt)) + " numel=" + std::to_string(s.numel) + " w0=" + std::to_string(s.b.w0);
}

TEST(IdentityCodec16, CompressFromAccumulatorRoundsLikeTheOracle) {
  const IdentityCodec codec;
  for (const Case16& s : cases()) {
    const Plan plan = make_identity_plan(s.dt, s.numel, 1, kUnit);
    const auto acc = random_floats(size_t(s.b.units() * kUnit), uint32_t(s.numel));
    Local x;
    x.acc = acc.data();
    x.acc_w0 = s.b.w0;
    std::vector<uint16_t> out(size_t(s.n) + 8, 0xabcd);
    ASSERT_EQ(codec.compress(x, plan, s.b, RngCtx{}, reinterpret_cast<uint8_t*>(out.data())), size_t(2 * s.n));
    for (int64_t i = 0; i < s.n; ++i)
      ASSERT_EQ(out[size_t(i)], from_f32(s.dt, acc[size_t(i)])) << name(s) << " i=" << i;
    for (size_t i = size_t(s.n); i < out.size(); ++i) ASSERT_EQ(out[i], 0xabcd) << name(s) << ": wrote past the end";
  }
}

TEST(IdentityCodec16, DecompressWithDivisorMatchesTheOracle) {
  const IdentityCodec codec;
  for (const Case16& s : cases())
    for (float d : {1.0f, 3.0f, 5.0f, 6.0f, 7.0f, 4.0f, 0.25f}) {  // 3, 5, 6, 7: a division; 4, 0.25: exact reciprocals
      const Plan plan = make_identity_plan(s.dt, s.numel, 1, kUnit);
      const auto in = random_halves(size_t(s.n), uint32_t(s.numel) + 1);
      std::vector<uint16_t> bucket(size_t(s.numel) + 8, 0x1234);
      Output y;
      y.bucket = bucket.data();
      y.divisor = d;
      codec.decompress(reinterpret_cast<const uint8_t*>(in.data()), 2 * size_t(s.n), plan, s.b, y);
      for (int64_t i = 0; i < s.n; ++i) {
        const uint16_t want = d == 1.0f ? in[size_t(i)] : from_f32(s.dt, to_f32(s.dt, in[size_t(i)]) / d);
        ASSERT_EQ(bucket[size_t(s.e0 + i)], want) << name(s) << " d=" << d << " i=" << i;
      }
      for (int64_t i = 0; i < s.e0; ++i) ASSERT_EQ(bucket[size_t(i)], 0x1234) << name(s) << ": wrote before the block";
      for (size_t i = size_t(s.numel); i < bucket.size(); ++i)
        ASSERT_EQ(bucket[i], 0x1234) << name(s) << ": wrote past the end";
    }
}

// The accumulate hops, with the local part in the bucket (first touch) and
// in a float accumulator; sums in float, then (fused hop) rounded to 16 bits.
TEST(IdentityCodec16, AccumulateHopsMatchTheOracle) {
  const IdentityCodec codec;
  for (const Case16& s : cases())
    for (bool from_acc : {false, true}) {
      const Plan plan = make_identity_plan(s.dt, s.numel, 1, kUnit);
      const auto in = random_halves(size_t(s.n), uint32_t(s.numel) + 2);
      const auto bucket = random_halves(size_t(s.numel), uint32_t(s.numel) + 3);
      const auto facc = random_floats(size_t(s.b.units() * kUnit), uint32_t(s.numel) + 4);
      Local x;
      if (from_acc) {
        x.acc = facc.data();
        x.acc_w0 = s.b.w0;
      } else {
        x.bucket = bucket.data();
      }
      auto local = [&](int64_t i) {
        return from_acc ? facc[size_t(i)] : to_f32(s.dt, bucket[size_t(s.e0 + i)]);
      };
      // NaN + NaN: which payload survives is up to the compiler (it may swap
      // the operands of +), so there any NaN passes; everywhere else exact bits
      auto both_nan = [&](int64_t i) { return std::isnan(local(i)) && std::isnan(to_f32(s.dt, in[size_t(i)])); };
      const auto* msg = reinterpret_cast<const uint8_t*>(in.data());

      std::vector<float> acc(size_t(s.n) + 8, -7.0f);
      codec.decompress_accumulate(msg, 2 * size_t(s.n), x, plan, s.b, acc.data());
      for (int64_t i = 0; i < s.n; ++i) {
        const float want = local(i) + to_f32(s.dt, in[size_t(i)]);
        if (both_nan(i)) {
          ASSERT_TRUE(std::isnan(acc[size_t(i)])) << name(s) << " i=" << i;
          continue;
        }
        ASSERT_EQ(f32_bits(acc[size_t(i)]), f32_bits(want)) << name(s) << " from_acc=" << from_acc << " i=" << i;
      }
      for (size_t i = size_t(s.n); i < acc.size(); ++i) ASSERT_EQ(acc[i], -7.0f) << name(s) << ": wrote past the end";

      std::vector<uint16_t> out(size_t(s.n) + 8, 0xabcd);
      ASSERT_EQ(codec.decompress_accumulate_recompress(msg, 2 * size_t(s.n), x, plan, s.b, RngCtx{},
                                                       reinterpret_cast<uint8_t*>(out.data())),
                2 * size_t(s.n));
      for (int64_t i = 0; i < s.n; ++i) {
        const uint16_t want = from_f32(s.dt, local(i) + to_f32(s.dt, in[size_t(i)]));
        if (both_nan(i)) {
          ASSERT_TRUE(std::isnan(to_f32(s.dt, out[size_t(i)]))) << name(s) << " i=" << i;
          continue;
        }
        ASSERT_EQ(out[size_t(i)], want) << name(s) << " from_acc=" << from_acc << " i=" << i;
      }
      for (size_t i = size_t(s.n); i < out.size(); ++i) ASSERT_EQ(out[i], 0xabcd) << name(s) << ": wrote past the end";
    }
}

}  // namespace
}  // namespace dynamiq
