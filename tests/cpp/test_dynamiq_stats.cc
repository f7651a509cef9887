// dynamiq_local_stats against a long-double oracle; non-finite flag; saturation.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>

#include "kernels/dynamiq/dynamiq_stats.h"
#include "kernels/base/float_bits.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

using namespace dqtest;

// Oracle: long double sums in plain index order.
void oracle(const std::vector<float>& x, int S, std::vector<double>& mean, std::vector<double>& sq) {
  const size_t units = (x.size() + size_t(S) - 1) / size_t(S);
  mean.assign(units, 0);
  sq.assign(units, 0);
  for (size_t u = 0; u < units; ++u) {
    long double s = 0, q = 0;
    size_t c = 0;
    for (size_t i = u * size_t(S); i < std::min(x.size(), (u + 1) * size_t(S)); ++i, ++c) {
      s += x[i];
      q += (long double)x[i] * x[i];
    }
    mean[u] = double(s / c);
    sq[u] = double(q);
  }
}

TEST(DynamiqStats, MatchesOracleForEveryDtypeAndOddLengths) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int S : {256, 64})
      for (size_t n : {size_t(1), size_t(7), size_t(255), size_t(257), size_t(10007)}) {
        auto x = student_t3(n, n + size_t(S));
        for (auto& v : x) v += 0.25f;
        std::vector<uint16_t> h(n);
        for (size_t i = 0; i < n; ++i) {
          if (dt == DType::kBF16) {
            h[i] = f32_to_bf16(x[i]);
            x[i] = bf16_to_f32(h[i]);
          } else if (dt == DType::kF16) {
            h[i] = f32_to_f16(x[i]);
            x[i] = f16_to_f32(h[i]);
          }
        }
        const void* data = dt == DType::kF32 ? static_cast<const void*>(x.data()) : h.data();
        const size_t units = (n + size_t(S) - 1) / size_t(S);
        std::vector<float> out(2 * units, -1.0f);
        EXPECT_FALSE(dynamiq_local_stats(data, dt, int64_t(n), S, out.data()));
        std::vector<double> m, q;
        oracle(x, S, m, q);
        for (size_t u = 0; u < units; ++u) {
          // double sums of <= 256 floats: relative error ~1e-14, then one float rounding
          EXPECT_NEAR(out[2 * u], m[u], 1e-6 * (std::fabs(m[u]) + 1e-3)) << dtype_name(dt) << " u=" << u;
          EXPECT_NEAR(out[2 * u + 1], q[u], 1e-6 * q[u]) << dtype_name(dt) << " u=" << u;
        }
      }
}

TEST(DynamiqStats, NonFiniteFlagAndSaturation) {
  std::vector<float> x(1000, 1.0f);
  std::vector<float> out(8);
  EXPECT_FALSE(dynamiq_local_stats(x.data(), DType::kF32, 1000, 256, out.data()));
  x[999] = NAN;
  EXPECT_TRUE(dynamiq_local_stats(x.data(), DType::kF32, 1000, 256, out.data()));
  x[999] = -INFINITY;
  EXPECT_TRUE(dynamiq_local_stats(x.data(), DType::kF32, 1000, 256, out.data()));
  std::vector<uint16_t> b(300, f32_to_bf16(1.0f));
  EXPECT_FALSE(dynamiq_local_stats(b.data(), DType::kBF16, 300, 256, out.data()));
  b[5] = 0x7f80;  // bf16 inf
  EXPECT_TRUE(dynamiq_local_stats(b.data(), DType::kBF16, 300, 256, out.data()));
  std::vector<uint16_t> f(300, f32_to_f16(1.0f));
  f[299] = 0x7e00;  // fp16 nan
  EXPECT_TRUE(dynamiq_local_stats(f.data(), DType::kF16, 300, 256, out.data()));
  // huge finite values: the sum of squares overflows float and saturates
  std::vector<float> big(256, 3e38f);
  EXPECT_FALSE(dynamiq_local_stats(big.data(), DType::kF32, 256, 256, out.data()));
  EXPECT_EQ(out[0], 3e38f);
  EXPECT_EQ(out[1], FLT_MAX);
  EXPECT_TRUE(std::isfinite(out[1]));
  // empty
  EXPECT_FALSE(dynamiq_local_stats(nullptr, DType::kF32, 0, 256, out.data()));
  EXPECT_THROW(dynamiq_local_stats(x.data(), DType::kF32, 10, 0, out.data()), Error);
}

}  // namespace
}  // namespace dynamiq
