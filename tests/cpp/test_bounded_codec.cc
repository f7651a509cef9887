// Mode "bounded", one compression: every decoded value is within e of the
// value encoded, checked exhaustively on edge data (ties at bin edges and
// their float neighbours, the quantiser's range limit, tiny and subnormal
// values and bounds, huge values, zeros, inf and nan) and on a stride through
// every float32 bit pattern; values without a valid bin travel raw and come
// back bit-exact; zero residual blocks cost one byte; malformed messages
// raise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hook/collective/config.h"
#include "kernels/bounded/bounded_codec.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

constexpr int32_t kUnit = 256;

// Encodes and decodes v with bound e; returns the decoded values.
std::vector<float> round_trip(const std::vector<float>& v, float e, BoundedBlockInfo* info = nullptr,
                              size_t* bytes = nullptr) {
  const int64_t n = int64_t(v.size());
  std::vector<uint8_t> msg(bounded_static_bytes_for(n, kUnit) + bounded_max_dynamic_bytes_for(n, kUnit));
  const size_t len = bounded_encode(v.data(), n, kUnit, e, msg.data(), info);
  EXPECT_LE(len, msg.size());
  std::vector<float> y(v.size());
  bounded_decode(msg.data(), len, n, kUnit, e, y.data());
  if (bytes) *bytes = len;
  return y;
}

// |y - x| <= e for finite x (computed exactly: both are floats close to each
// other or the difference is far from e); non-finite x must come back bit-exact.
void expect_within(const std::vector<float>& x, const std::vector<float>& y, float e, const char* what) {
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      if (f32_bits(x[i]) != f32_bits(y[i]) && ++bad < 5)
        ADD_FAILURE() << what << ": non-finite " << x[i] << " came back as " << y[i];
      continue;
    }
    const double d = std::fabs(double(x[i]) - double(y[i]));
    if (!(d <= double(e)) && ++bad < 5)
      ADD_FAILURE() << what << ": e=" << e << " x=" << x[i] << " (bits " << std::hex << f32_bits(x[i]) << std::dec
                    << ") y=" << y[i] << " |err|=" << d;
  }
  EXPECT_EQ(bad, 0) << what;
}

// e values: powers of two (exact bins), decimal bounds (inexact w and x / w),
// a subnormal bound, a huge one.
const std::vector<float> kBounds = {1.0f, 0.5f, 0x1p-20f, 1e-3f, 0.1f, 3.7e-5f, 7.0f, 1e-40f, 1e30f, 0x1p126f};

// n consecutive floats going up from x (n/2 below x too).
void push_neighbourhood(std::vector<float>& v, float x, int n) {
  float lo = x, hi = x;
  for (int i = 0; i < n / 2; ++i) {
    lo = std::nextafter(lo, -std::numeric_limits<float>::infinity());
    hi = std::nextafter(hi, std::numeric_limits<float>::infinity());
    v.push_back(lo);
    v.push_back(hi);
  }
  v.push_back(x);
}

TEST(BoundedCodec, ErrorWithinBoundOnEdgeData) {
  for (float e : kBounds) {
    const float w = 2.0f * e;
    std::vector<float> v;
    // ties at bin edges (k + 1/2) w, for small and large k, both signs, and their neighbours
    for (double k : {0.0, 1.0, 2.0, 3.0, 1000.0, 12345.0, 4194303.0, 8388607.0, 16777214.0, 16777215.0}) {
      for (double s : {1.0, -1.0}) {
        push_neighbourhood(v, float(s * (k + 0.5) * double(w)), 64);
        push_neighbourhood(v, float(s * k * double(w)), 16);
      }
    }
    // the quantiser's range limit: |x / w| near 2^24, some bins past it (overflow: must go raw)
    for (double k : {16777216.0, 16777216.5, 16777217.0, 16777218.0, 33554432.0, 1e9}) {
      push_neighbourhood(v, float(k * double(w)), 32);
      push_neighbourhood(v, float(-k * double(w)), 32);
    }
    // tiny and subnormal values, zeros
    for (float t : {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-40f, std::numeric_limits<float>::min(), 1e-30f, 1e-10f})
      push_neighbourhood(v, t, 16);
    // huge values and non-finite ones (which travel raw, bit-exact)
    for (float t : {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 1e38f, 3e37f})
      push_neighbourhood(v, t, 8);
    v.push_back(std::numeric_limits<float>::infinity());
    v.push_back(-std::numeric_limits<float>::infinity());
    v.push_back(std::numeric_limits<float>::quiet_NaN());
    v.push_back(bits_f32(0x7fa00001u));  // a signalling NaN payload
    BoundedBlockInfo info;
    const std::vector<float> y = round_trip(v, e, &info);
    expect_within(v, y, e, "edge data");
    // a value whose bin index would pass 2^24 cannot be binned: it travels raw, bit-exact
    for (size_t i = 0; i < v.size(); ++i) {
      if (!(std::fabs(double(v[i]) / double(w)) <= 16777217.0)) {
        ASSERT_EQ(f32_bits(y[i]), f32_bits(v[i])) << "e=" << e << " x=" << v[i];
      }
    }
    EXPECT_GT(info.raw_blocks, 0) << "the overflowing and non-finite values must take raw blocks";
  }
}

// Every 4099th float32 bit pattern (about 1M values, every exponent, both signs).
TEST(BoundedCodec, ErrorWithinBoundOnAStrideThroughAllFloats) {
  std::vector<float> v;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 4099) v.push_back(bits_f32(uint32_t(b)));
  for (float e : {1e-3f, 0x1p-10f, 1e-38f, 1e20f}) expect_within(v, round_trip(v, e), e, "stride");
}

// Random smooth and noisy data at many bounds: the bound holds, and a value
// that went raw is bit-exact (so its error is 0, not just <= e).
TEST(BoundedCodec, ErrorWithinBoundOnRandomData) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd;
  for (int trial = 0; trial < 40; ++trial) {
    const float e = std::ldexp(1.0f + float(trial % 7) / 7.0f, -(trial % 25));
    std::vector<float> v(10000 + size_t(trial));
    float walk = 0.0f;
    for (auto& x : v) {
      walk += nd(g) * 0.01f;
      x = trial % 2 ? walk : nd(g) * std::ldexp(1.0f, trial % 11 - 5);
    }
    expect_within(v, round_trip(v, e), e, "random");
  }
}

// Zero residual blocks cost their code-length byte only: a constant bucket
// is header + anchors + one byte per 32 values.
TEST(BoundedCodec, ConstantBlocksCostOneByte) {
  const int64_t n = 4096;
  std::vector<float> v(size_t(n), 3.0f);
  size_t bytes = 0;
  BoundedBlockInfo info;
  const std::vector<float> y = round_trip(v, 0.01f, &info, &bytes);
  EXPECT_EQ(info.zero_blocks, n / 32);
  EXPECT_EQ(bytes, size_t(16 + 4 * (n / kUnit) + n / 32));
  expect_within(v, y, 0.01f, "constant");
  // all zeros with e = 0 (a relative bound on an all-zero bucket): still one byte per block
  std::vector<float> z(size_t(n), 0.0f);
  const std::vector<float> yz = round_trip(z, 0.0f, &info, &bytes);
  EXPECT_EQ(info.zero_blocks, n / 32);
  EXPECT_EQ(yz, z);
  // e = 0 and nonzero values: raw, exact
  z[100] = 1.5f;
  EXPECT_EQ(round_trip(z, 0.0f, &info), z);
  EXPECT_EQ(info.raw_blocks, 1);
}

// A smooth ramp codes in few bits per value (Lorenzo residuals are small).
TEST(BoundedCodec, SmoothDataCompresses) {
  const int64_t n = 1 << 16;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(float(i) * 1e-3f) * 10.0f;
  size_t bytes = 0;
  const std::vector<float> y = round_trip(v, 1e-3f, nullptr, &bytes);
  expect_within(v, y, 1e-3f, "smooth");
  EXPECT_LT(double(bytes) * 8 / double(n), 4.0) << "bits per value";
}

std::vector<uint8_t> encode(const std::vector<float>& v, float e) {
  const int64_t n = int64_t(v.size());
  std::vector<uint8_t> msg(bounded_static_bytes_for(n, kUnit) + bounded_max_dynamic_bytes_for(n, kUnit));
  msg.resize(bounded_encode(v.data(), n, kUnit, e, msg.data()));
  return msg;
}

TEST(BoundedCodec, MalformedMessagesRaise) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 37) * 0.3f;
  const float e = 0.01f;
  const std::vector<uint8_t> good = encode(v, e);
  std::vector<float> y(v.size());
  const int64_t n = int64_t(v.size());
  auto decode = [&](std::vector<uint8_t> m, float ee = 0.01f) {
    bounded_decode(m.data(), m.size(), n, kUnit, ee, y.data());
  };
  EXPECT_NO_THROW(decode(good));
  {
    auto m = good;
    m.pop_back();
    EXPECT_THROW(decode(m), MalformedMessage) << "truncated";
  }
  {
    auto m = good;
    m[0] ^= 1;
    EXPECT_THROW(decode(m), MalformedMessage) << "magic";
  }
  EXPECT_THROW(decode(good, 0.02f), MalformedMessage) << "another bound than the plan's";
  {
    auto m = good;
    m[16 + 4 * 4] = 28;  // first code length: beyond 27 and not raw
    EXPECT_THROW(decode(m), MalformedMessage) << "code length";
  }
  {
    auto m = good;
    store_u32(m.data() + 16, uint32_t(kBoundedQMax + 1));  // anchor out of range
    EXPECT_THROW(decode(m), MalformedMessage) << "anchor";
  }
  {
    auto m = good;
    store_u32(m.data() + 8, load_u32(m.data() + 8) + 4);
    m.resize(m.size() + 4);
    EXPECT_THROW(decode(m), MalformedMessage) << "dynamic size";
  }
}

TEST(BoundedScheme, ConfigValidation) {
  CollectiveConfig c;
  c.mode = mode_id("bounded");
  EXPECT_THROW(make_scheme(c), Error) << "no bound";
  c.params.set("error_bound", double(1e-3));
  EXPECT_NO_THROW(make_scheme(c));
  c.params.set("error_bound_rel", double(1e-3));
  EXPECT_THROW(make_scheme(c), Error) << "both bounds";
  c.params.erase("error_bound");
  EXPECT_NO_THROW(make_scheme(c));
  c.params.set("error_bound_rel", double(2.0));
  EXPECT_THROW(make_scheme(c), Error) << "relative bound above 1";
  c.params.erase("error_bound_rel");
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e39}) {
    c.params.set("error_bound", double(bad));
    EXPECT_THROW(make_scheme(c), Error) << bad;
  }
}

// The plan's bound: the absolute one rounded down to float32; the relative
// one r x (sum of the ranks' ranges) / world.
TEST(BoundedScheme, PlanResolvesTheBound) {
  CollectiveConfig c;
  c.mode = mode_id("bounded");
  c.params.set("error_bound", double(0.1));  // not a float: rounded down
  PlanState st;
  PlanInfo info;
  Plan p = make_scheme(c)->make_plan(DType::kF32, 10000, 4, 4, nullptr, st, info);
  EXPECT_LE(double(p.error_bound), 0.1);
  float f = float(0.1);
  if (double(f) > 0.1) f = std::nextafter(f, 0.0f);
  EXPECT_EQ(p.error_bound, f) << "the largest float32 <= 0.1";
  c.params.erase("error_bound");
  c.params.set("error_bound_rel", double(0.01));
  const auto s = make_scheme(c);
  ASSERT_EQ(s->stats_count(DType::kF32, 10000), 1);
  std::vector<float> x(10000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.5f - 100.0f;  // range 4999.5
  float stat = 0;
  EXPECT_FALSE(s->local_pass(x.data(), DType::kF32, 10000, &stat));
  EXPECT_EQ(stat, 4999.5f);
  x[7] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(s->local_pass(x.data(), DType::kF32, 10000, &stat)) << "non-finite input reported";
  const float sum = 4999.5f + 1000.0f;  // two ranks
  p = s->make_plan(DType::kF32, 10000, 2, 2, &sum, st, info);
  EXPECT_NEAR(p.error_bound, 0.01 * 5999.5 / 2, 1e-6);
  EXPECT_LE(double(p.error_bound), 0.01 * double(sum) / 2);
}

}  // namespace
}  // namespace dynamiq
