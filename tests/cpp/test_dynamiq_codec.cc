// The DynamiQ codec on its own: wire format against an independent decoder,
// byte counts, unbiasedness, error against the exact expected error and a
// derived worst case, fused == unfused, edge data, malformed input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <numeric>

#include "kernels/dynamiq/dynamiq_codec.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

using namespace dqtest;

const int kAllWidths[] = {1, 2, 4, 8, 16};

int widx(int b) { return b == 1 ? 0 : b == 2 ? 1 : b == 4 ? 2 : 3; }

// Smallest bf16 >= m (m >= 0 finite), written with nextafter-free integer steps.
float bf16_up(float m) {
  uint32_t u;
  std::memcpy(&u, &m, 4);
  uint32_t h = u >> 16;
  float v;
  for (;;) {
    const uint32_t b = h << 16;
    std::memcpy(&v, &b, 4);
    if (v >= m) return v;
    ++h;
  }
}

// The SG scale the format specifies: M rounded up to bf16, and at least 2^-118
// when M > 0 (dynamiq_math.h, dq_sg_scale_bits).
float sg_scale(float m) { return m > 0 ? std::max(bf16_up(m), std::ldexp(1.0f, -118)) : 0.0f; }

// ---- expected error, written out from the definitions --------------------------

struct ErrModel {
  double expected = 0;  // E ||x^ - x||^2 for one quantisation
  double worst = 0;     // the worst-case bound of the derivation below
  double max_abs_bound_violations = 0;
};

// For one SG width b and data x (no bias, identity order):
//  up scales (default): sc_k = min{R255[r] * Msg >= g_k}; a = |x|/sc_k;
//    b >= 2: Var = sc^2 (L[j+1]-a)(a-L[j])  <=  sc^2 D^2 / 4, D = max gap;
//    b = 1:  Var = sc^2 - x^2               <=  sc^2.
//  stochastic scales: sc random with E[sc] = g_k, Var_s = f(1-f) (hi-lo)^2;
//    E[(sc q - x)^2] = g^2 Var_q + Var_s (a^2 + Var_q), a = |x|/g
//    <= g^2 D^2/4 + (Msg/255)^2/4 (1 + D^2/4).
// So vNMSE <= (D^2/4) * sum_k s*sc_k^2 / ||x||^2 for up scales: the SR step
// variance times the data's group peak-to-average power ratio.
ErrModel error_model(const std::vector<float>& x, int b, const DynamiqParams& prm) {
  const int S = prm.fmt.S, s = prm.fmt.s, G = S / s;
  std::vector<double> L;
  double D = 2.0;  // width 1: the two "levels" -1, +1
  if (b > 1) {
    L = paper_levels(b, prm.eps[size_t(widx(b))], prm.uniform_levels);
    D = 0;
    for (size_t j = 0; j + 1 < L.size(); ++j) D = std::max(D, L[j + 1] - L[j]);
  }
  ErrModel em;
  const size_t n = x.size();
  for (size_t sg0 = 0; sg0 < n; sg0 += size_t(S)) {
    std::vector<float> t(size_t(S), 0.0f);
    for (size_t i = 0; i < size_t(S) && sg0 + i < n; ++i) t[i] = x[sg0 + i];
    float M = 0;
    for (float v : t) M = std::max(M, std::fabs(v));
    const float Msg = sg_scale(M);
    for (int k = 0; k < G; ++k) {
      float g = 0;
      for (int i = 0; i < s; ++i) g = std::max(g, std::fabs(t[size_t(k * s + i)]));
      if (g == 0) continue;
      if (!prm.stochastic_group_scales) {
        double sc = Msg;
        for (int r = 0; r < 256; ++r) {
          const float c = float(r / 255.0) * Msg;
          if (c >= g) {
            sc = c;
            break;
          }
        }
        for (int i = 0; i < s; ++i) {
          const double xv = t[size_t(k * s + i)], a = std::min(1.0, std::fabs(xv) / sc);
          if (b == 1) {
            em.expected += sc * sc - xv * xv;
          } else {
            size_t j = 0;
            while (j + 2 < L.size() && L[j + 1] <= a) ++j;
            em.expected += sc * sc * (L[j + 1] - a) * (a - L[j]);
          }
        }
        em.worst += double(s) * sc * sc * (b == 1 ? 1.0 : D * D / 4);
      } else {
        const double tt = 255.0 * double(g) / double(Msg);
        const double f = tt - std::floor(tt);
        const double lo = double(float(std::floor(tt) / 255.0) * Msg);
        const double hi = double(float(std::min(255.0, std::floor(tt) + 1) / 255.0) * Msg);
        const double vs = f * (1 - f) * (hi - lo) * (hi - lo);
        for (int i = 0; i < s; ++i) {
          const double xv = t[size_t(k * s + i)], a = std::min(1.0, std::fabs(xv) / g);
          double vq;
          if (b == 1) {
            vq = 1 - a * a;
          } else {
            size_t j = 0;
            while (j + 2 < L.size() && L[j + 1] <= a) ++j;
            vq = (L[j + 1] - a) * (a - L[j]);
          }
          em.expected += double(g) * g * vq + vs * (a * a + vq);
        }
        const double u = double(Msg) / 255.0;
        const double dq = b == 1 ? 1.0 : D * D / 4;
        em.worst += double(s) * (double(g) * g * dq + u * u / 4 * (1 + dq));
      }
    }
  }
  return em;
}

double sumsq(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * v;
  return s;
}

// ---- wire format -------------------------------------------------------------------

TEST(DynamiqCodec, BytesMatchFormatAndOracleDecoderForEveryWidthAndFormat) {
  for (bool hier : {true, false})
    for (int S : {256, 64})
      for (int s : {16, 8}) {
        DynamiqParams prm;
        prm.fmt.S = S;
        prm.fmt.s = s;
        prm.fmt.hierarchical = hier;
        DynamiqCodec codec(prm);
        const int64_t numel = 5 * S + 37;  // partial last SG
        const int64_t units = ceil_div<int64_t>(numel, S);
        std::vector<uint8_t> bits;
        for (int64_t u = 0; u < units; ++u) bits.push_back(uint8_t(kAllWidths[u % 5]));
        Plan p = make_dynamiq_plan(DType::kF32, numel, prm.fmt, bits, {}, {}, 1);
        const auto x = gaussian(size_t(numel), 11);
        const auto bytes = compress_bucket(codec, p, x.data(), rng_ctx(1, 2));
        int64_t want = 0;
        for (auto b : bits) want += dynamiq_sg_bytes(b, prm.fmt);
        ASSERT_EQ(int64_t(bytes.size()), want);
        ASSERT_EQ(codec.static_bytes(p, whole(p)), size_t(want));
        const auto dec = decode_f32(codec, p, bytes);
        const auto ref = oracle_decode(bytes, p, prm);
        for (int64_t i = 0; i < numel; ++i)
          ASSERT_NEAR(dec[size_t(i)], ref[size_t(i)], 1e-6 * std::fabs(ref[size_t(i)]) + 1e-30)
              << "S=" << S << " s=" << s << " hier=" << hier << " i=" << i;
        // decompress (store_unit) gives the same values for an fp32 bucket
        const auto fin = decompress_f32(codec, p, bytes);
        for (int64_t i = 0; i < numel; ++i) ASSERT_EQ(fin[size_t(i)], dec[size_t(i)]);
      }
}

TEST(DynamiqCodec, SgScaleIsMaxRoundedUpAndGroupScalesNeverExceedIt) {
  DynamiqParams prm;
  DynamiqCodec codec(prm);
  const auto x = student_t3(4096, 5);
  for (int b : {1, 2, 4, 8}) {
    Plan p = uniform_plan(4096, b);
    const auto bytes = compress_bucket(codec, p, x.data(), rng_ctx(3, 4));
    const int64_t sgb = dynamiq_sg_bytes(b, prm.fmt);
    for (int64_t u = 0; u < p.num_units; ++u) {
      float M = 0;
      for (int i = 0; i < 256; ++i) M = std::max(M, std::fabs(x[size_t(u * 256 + i)]));
      const uint8_t* sg = bytes.data() + u * sgb;
      EXPECT_EQ(bf16_le(sg), sg_scale(M));
      // up-rounded group scales: the decoded scale covers the group max
      for (int k = 0; k < 16; ++k) {
        float g = 0;
        for (int i = 0; i < 16; ++i) g = std::max(g, std::fabs(x[size_t(u * 256 + k * 16 + i)]));
        const float sc = float(sg[2 + k] / 255.0) * bf16_le(sg);
        EXPECT_GE(sc, g);
        if (sg[2 + k] > 0) {
          EXPECT_LT(float((sg[2 + k] - 1) / 255.0) * bf16_le(sg), g);
        }
      }
    }
  }
}

// ---- unbiasedness ------------------------------------------------------------------

// Over K independent keys, per element z = (mean - x) / (sd / sqrt(K)).
// Under unbiasedness sum z^2 ~ chi2(n) (n = elements with sd > 0): assert
// sum z^2 < n + 6 sqrt(2n) (a 6-sigma bound, false alarm < 1e-6 even with the
// chi2's right skew at n >= 256) and |mean z| < 5/sqrt(n). Elements the codec
// never saw move (sd = 0: exact, or a rare outcome not drawn) must be close.
void check_unbiased(const DynamiqParams& prm, int b, DType dt, bool corr, int world, float mag = 1.0f) {
  DynamiqCodec codec(prm);
  const int64_t numel = 512;
  auto x = gaussian(size_t(numel), 100 + b);
  for (auto& v : x) v *= mag;
  x[3] = 0.0f;
  x[300] = 0.0f;
  x[17] = -x[16];
  std::vector<uint16_t> xb(static_cast<size_t>(numel));
  if (dt == DType::kBF16)
    for (int64_t i = 0; i < numel; ++i) {
      xb[size_t(i)] = f32_to_bf16(x[size_t(i)]);
      x[size_t(i)] = bf16_to_f32(xb[size_t(i)]);
    }
  const void* bucket = dt == DType::kBF16 ? static_cast<const void*>(xb.data()) : x.data();
  Plan p = uniform_plan(numel, b, prm.fmt, dt);
  const int K = 3000;
  std::vector<double> s1(size_t(numel), 0), s2(size_t(numel), 0);
  std::vector<float> first;
  std::vector<char> moved(size_t(numel), 0);
  for (int k = 0; k < K; ++k) {
    const auto bytes = compress_bucket(codec, p, bucket, rng_ctx(777, uint64_t(k), world - 1, world, corr));
    const auto d = decode_f32(codec, p, bytes);
    if (k == 0) first = d;
    for (int64_t i = 0; i < numel; ++i) {
      moved[size_t(i)] |= d[size_t(i)] != first[size_t(i)] ? 1 : 0;
      const double e = double(d[size_t(i)]) - x[size_t(i)];
      s1[size_t(i)] += e;
      s2[size_t(i)] += e * e;
    }
  }
  double chi = 0, zsum = 0, xmax = 0;
  for (float v : x) xmax = std::max(xmax, double(std::fabs(v)));
  int n = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const double m = s1[size_t(i)] / K;
    const double var = (s2[size_t(i)] - K * m * m) / (K - 1);
    if (!moved[size_t(i)]) {
      // Never moved in K draws (var is then rounding noise, not a variance):
      // either exact, or the other outcome has
      // probability q ~< 1/K and the observed offset is q * jump <= q * 2 max|x|.
      EXPECT_LE(std::fabs(m), 20.0 * xmax / K) << "element " << i;
      continue;
    }
    const double z = m / std::sqrt(var / K);
    chi += z * z;
    zsum += z;
    ++n;
  }
  ASSERT_GT(n, 256);
  EXPECT_LT(chi, n + 6 * std::sqrt(2.0 * n)) << "width " << b << " dtype " << dtype_name(dt);
  EXPECT_LT(std::fabs(zsum / n), 5.0 / std::sqrt(double(n))) << "width " << b;
}

TEST(DynamiqCodec, UnbiasedForEveryWidthFp32AndBf16) {
  for (bool stoch_scales : {false, true})
    for (int b : {1, 2, 4, 8})
      for (DType dt : {DType::kF32, DType::kBF16})
        for (int world : {1, 5}) {
          DynamiqParams prm;
          prm.stochastic_group_scales = stoch_scales;
          SCOPED_TRACE("width " + std::to_string(b) + " stochastic scales " +
                       std::to_string(stoch_scales) + " world " + std::to_string(world));
          check_unbiased(prm, b, dt, true, world);
        }
}

// Values so small that a group's normaliser (r/255 of the SG scale) would be
// below 2^-128 and its reciprocal would overflow: 1e-37 (normal values) and
// 1e-39 (subnormal values). The SG scale's floor of 2^-118 keeps every
// reciprocal finite, so the codes stay unbiased (before it: zeros decoded as
// nonzero and small values pushed to the group scale).
TEST(DynamiqCodec, UnbiasedForValuesNearAndBelowTheSmallestNormalFloat) {
  for (float mag : {1e-37f, 1e-39f})
    for (int b : {2, 4, 8})
      for (int scales = 0; scales < 3; ++scales) {
        DynamiqParams prm;
        prm.stochastic_group_scales = scales == 1;
        prm.fmt.hierarchical = scales != 2;
        char m[32];
        std::snprintf(m, sizeof m, "%g", double(mag));
        SCOPED_TRACE(std::string("magnitude ") + m + " width " + std::to_string(b) +
                     " scales " + (scales == 0 ? "up" : scales == 1 ? "stochastic" : "flat"));
        check_unbiased(prm, b, DType::kF32, false, 1, mag);
      }
}

TEST(DynamiqCodec, UnbiasedWithFlatScalesAndUniformLevels) {
  DynamiqParams prm;
  prm.fmt.hierarchical = false;
  check_unbiased(prm, 4, DType::kF32, false, 1);
  DynamiqParams uni;
  uni.uniform_levels = true;
  check_unbiased(uni, 8, DType::kF32, true, 3);
}

TEST(DynamiqCodec, Width16IsRoundToNearestBf16AndSoBiased) {
  DynamiqCodec codec;
  const auto x = gaussian(1000, 9);
  Plan p = uniform_plan(1000, 16);
  const auto d = decode_f32(codec, p, compress_bucket(codec, p, x.data(), rng_ctx(1, 1)));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(d[i], bf16_to_f32(f32_to_bf16(x[i])));
    // half a bf16 ulp: 8 significant bits, |err| <= 2^-8 |x|
    ASSERT_LE(std::fabs(d[i] - x[i]), std::ldexp(std::fabs(x[i]), -8));
  }
}

// ---- error ------------------------------------------------------------------------------

// vNMSE of one quantisation, averaged over 6 keys on 2^16 values, equals the
// exact expected error (within 5%: the relative standard error of the mean of
// 4e5 bounded per-element errors is well under 1%) and stays below the worst
// case bound derived in error_model(). Width 16: RNE bf16, |err| <= 2^-8 |x|,
// so vNMSE <= 2^-16.
TEST(DynamiqCodec, VnmseMatchesExpectationAndBoundGaussianAndStudentT) {
  const size_t n = 1 << 16;
  for (int dist = 0; dist < 2; ++dist) {
    const auto x = dist == 0 ? gaussian(n, 42) : student_t3(n, 43);
    const double ss = sumsq(x);
    for (bool stoch : {false, true})
      for (int b : kAllWidths) {
        DynamiqParams prm;
        prm.stochastic_group_scales = stoch;
        DynamiqCodec codec(prm);
        Plan p = uniform_plan(int64_t(n), b);
        double err = 0;
        const int K = 6;
        for (int k = 0; k < K; ++k) {
          const auto d = decode_f32(codec, p, compress_bucket(codec, p, x.data(), rng_ctx(5, uint64_t(k))));
          for (size_t i = 0; i < n; ++i) err += (double(d[i]) - x[i]) * (double(d[i]) - x[i]);
        }
        const double vnmse = err / K / ss;
        const char* dn = dist == 0 ? "gaussian" : "student-t3";
        if (b == 16) {
          EXPECT_LE(vnmse, std::ldexp(1.0, -16)) << dn;
          continue;
        }
        const ErrModel em = error_model(x, b, prm);
        const double ev = em.expected / ss, wv = em.worst / ss;
        std::printf("  %-10s width %d %s scales: vNMSE %.4g  expected %.4g  bound %.4g\n", dn, b,
                    stoch ? "stochastic" : "up        ", vnmse, ev, wv);
        EXPECT_NEAR(vnmse / ev, 1.0, 0.05) << dn << " width " << b << " stoch " << stoch;
        EXPECT_LE(ev, wv * (1 + 1e-9)) << dn << " width " << b;
        EXPECT_LE(vnmse, wv * 1.05) << dn << " width " << b;
      }
  }
}

// ---- fused == unfused --------------------------------------------------------------

TEST(DynamiqCodec, FusedEqualsUnfusedBitForBit) {
  std::mt19937 g(7);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int world : {1, 2, 3, 8, 17})
      for (bool corr : {true, false})
        for (int variant = 0; variant < 3; ++variant) {
          DynamiqParams prm;
          prm.stochastic_group_scales = variant == 1;
          prm.fmt.hierarchical = variant != 2;  // 2: flat bf16 group scales
          DynamiqCodec codec(prm);
          const int64_t numel = 256 * 23 + 100;
          const int64_t units = ceil_div<int64_t>(numel, 256);
          std::vector<uint8_t> bits;
          std::vector<int32_t> order(static_cast<size_t>(units));
          std::vector<float> bias;
          for (int64_t u = 0; u < units; ++u) {
            bits.push_back(uint8_t(kAllWidths[g() % 5]));
            bias.push_back(float(int(g() % 100) - 50) * 0.01f);
          }
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), g);
          Plan p = make_dynamiq_plan(dt, numel, prm.fmt, bits, order, bias, 1);
          // local bucket in its dtype
          const auto xf = gaussian(size_t(numel), g());
          std::vector<uint16_t> x16(static_cast<size_t>(numel));
          for (int64_t i = 0; i < numel; ++i)
            x16[size_t(i)] = dt == DType::kBF16 ? f32_to_bf16(xf[size_t(i)]) : f32_to_f16(xf[size_t(i)]);
          const void* bucket = dt == DType::kF32 ? static_cast<const void*>(xf.data()) : x16.data();
          // the received message: another rank's compression
          const auto other = gaussian(size_t(numel), g());
          Plan pf = make_dynamiq_plan(DType::kF32, numel, prm.fmt, bits, order, bias, 1);
          const auto msg = compress_bucket(codec, pf, other.data(), rng_ctx(9, 1, 0, world, corr));
          const RngCtx r = rng_ctx(9, 1, world - 1, world, corr);
          // blocks of a few units, from the bucket and from an accumulator
          for (int64_t w0 = 0; w0 < units; w0 += 5) {
            const Block b{w0, std::min(units, w0 + 5)};
            const size_t sb = codec.static_bytes(p, b);
            const size_t off = size_t(p.wire_offset[size_t(b.w0)]);
            const uint8_t* in = msg.data() + off;
            Local lx;
            lx.bucket = bucket;
            std::vector<uint8_t> fused(sb), unfused(sb);
            ASSERT_EQ(codec.decompress_accumulate_recompress(in, sb, lx, p, b, r, fused.data()), sb);
            std::vector<float> acc(size_t(b.units() * 256));
            codec.decompress_accumulate(in, sb, lx, p, b, acc.data());
            Local la;
            la.acc = acc.data();
            la.acc_w0 = b.w0;
            ASSERT_EQ(codec.compress(la, p, b, r, unfused.data()), sb);
            ASSERT_EQ(fused, unfused) << "dtype " << dtype_name(dt) << " world " << world;
            // second hop: local data from an accumulator (aliasing acc in place)
            std::vector<uint8_t> fused2(sb), unfused2(sb);
            codec.decompress_accumulate_recompress(fused.data(), sb, la, p, b, r, fused2.data());
            codec.decompress_accumulate(fused.data(), sb, la, p, b, acc.data());  // x aliases acc
            codec.compress(la, p, b, r, unfused2.data());
            ASSERT_EQ(fused2, unfused2);
          }
        }
}

// ---- edge data ----------------------------------------------------------------------------

TEST(DynamiqCodec, ZerosDecodeToZerosAndConstantsWithTheirMeanAreExact) {
  DynamiqCodec codec;
  for (int b : kAllWidths)
    for (int64_t numel : {int64_t(1), int64_t(255), int64_t(1000)}) {
      std::vector<float> z(size_t(numel), 0.0f);
      Plan p = uniform_plan(numel, b);
      const auto d = decompress_f32(codec, p, compress_bucket(codec, p, z.data(), rng_ctx(1, 2)));
      for (float v : d) ASSERT_EQ(v, 0.0f) << "width " << b;
      // constant c with plan.bias = c (the driver subtracts the global mean)
      const float c = -3.14159f;
      std::vector<float> cv(size_t(numel), c);
      Plan pb = make_dynamiq_plan(DType::kF32, numel, DynamiqFormat(),
                                  std::vector<uint8_t>(size_t(p.num_units), uint8_t(b)), {},
                                  std::vector<float>(size_t(p.num_units), c), 1);
      const auto dc = decompress_f32(codec, pb, compress_bucket(codec, pb, cv.data(), rng_ctx(1, 2)), 1.0f);
      for (float v : dc) ASSERT_EQ(v, c) << "width " << b;
    }
}

// Deterministic bound for up-rounded scales: a value moves by at most one
// level gap times its group scale; |x^ - x| <= D * sc_k (+ float slack).
void check_deterministic_bound(const std::vector<float>& x, int b, const char* what) {
  DynamiqParams prm;
  DynamiqCodec codec(prm);
  Plan p = uniform_plan(int64_t(x.size()), b);
  double D = 2.0;
  if (b > 1) {
    const auto L = paper_levels(b, prm.eps[size_t(widx(b))], false);
    D = 0;
    for (size_t j = 0; j + 1 < L.size(); ++j) D = std::max(D, L[j + 1] - L[j]);
  }
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const auto d = decompress_f32(codec, p, compress_bucket(codec, p, x.data(), rng_ctx(seed, 0)));
    for (size_t sg0 = 0; sg0 < x.size(); sg0 += 256) {
      float M = 0;
      for (size_t i = sg0; i < std::min(x.size(), sg0 + 256); ++i) M = std::max(M, std::fabs(x[i]));
      const float Msg = sg_scale(M);
      for (size_t g0 = sg0; g0 < std::min(x.size(), sg0 + 256); g0 += 16) {
        float gm = 0;
        for (size_t i = g0; i < std::min(x.size(), g0 + 16); ++i) gm = std::max(gm, std::fabs(x[i]));
        double sc = Msg;
        for (int r = 0; r < 256; ++r)
          if (float(r / 255.0) * Msg >= gm) {
            sc = float(r / 255.0) * Msg;
            break;
          }
        for (size_t i = g0; i < std::min(x.size(), g0 + 16); ++i) {
          ASSERT_TRUE(std::isfinite(d[i])) << what << " width " << b << " i=" << i;
          if (b == 16) {
            ASSERT_EQ(d[i], bf16_to_f32(f32_to_bf16(x[i])));
          } else {
            ASSERT_LE(std::fabs(double(d[i]) - x[i]), D * sc * (1 + 1e-6) + 1e-44)
                << what << " width " << b << " i=" << i << " x=" << x[i] << " got " << d[i];
          }
        }
      }
    }
  }
}

TEST(DynamiqCodec, EdgeDataOutlierDenormalsOddLengths) {
  for (int b : kAllWidths) {
    auto x = gaussian(1024, 3);
    x[300] = 1e30f;  // a single huge outlier in SG 1
    check_deterministic_bound(x, b, "outlier");
    std::vector<float> den(777);
    std::mt19937 g(1);
    for (auto& v : den) v = bits_f32((g() & 0x807fffffu));  // random subnormals, both signs
    den[5] = 1e-38f;                                         // and a small normal
    check_deterministic_bound(den, b, "denormals");
    for (size_t n : {size_t(1), size_t(15), size_t(17), size_t(255), size_t(257), size_t(4099)})
      check_deterministic_bound(gaussian(n, n), b, "odd length");
  }
}

TEST(DynamiqCodec, OutlierOnlyHurtsItsOwnSuperGroup) {
  DynamiqCodec codec;
  auto x = gaussian(1024, 3);
  x[300] = 1e30f;
  Plan p = uniform_plan(1024, 8);
  const auto d = decompress_f32(codec, p, compress_bucket(codec, p, x.data(), rng_ctx(1, 1)));
  EXPECT_NEAR(d[300], 1e30, 1e30 * 0.02);
  double e = 0, s = 0;
  for (size_t i = 0; i < 1024; ++i)
    if (i / 256 != 1) {
      e += (d[i] - x[i]) * (d[i] - x[i]);
      s += double(x[i]) * x[i];
    }
  EXPECT_LT(e / s, 1e-3);  // other SGs: 8-bit quality
}

TEST(DynamiqCodec, EmptyBucketAndEmptyBlock) {
  DynamiqCodec codec;
  Plan p = uniform_plan(0, 4);
  EXPECT_EQ(p.num_units, 0);
  std::vector<uint8_t> out(1);
  Local x;
  EXPECT_EQ(codec.compress(x, p, whole(p), rng_ctx(1, 1), out.data()), 0u);
  Plan q = uniform_plan(1000, 4);
  const Block empty{2, 2};
  EXPECT_EQ(codec.static_bytes(q, empty), 0u);
  Output y;
  codec.decompress(out.data(), 0, q, empty, y);
}

TEST(DynamiqCodec, OutputWritesOnlyTheBucketAndAppliesBiasAndDivisor) {
  DynamiqCodec codec;
  const int64_t numel = 300;
  const auto x = gaussian(size_t(numel), 4);
  Plan p = make_dynamiq_plan(DType::kF32, numel, DynamiqFormat(), {8, 8}, {1, 0}, {0.5f, -2.0f}, 1);
  const auto bytes = compress_bucket(codec, p, x.data(), rng_ctx(1, 1));
  const auto d1 = decode_f32(codec, p, bytes);  // without bias (the accumulator view)
  std::vector<float> out(size_t(numel) + 8, 777.0f);
  Output y;
  y.bucket = out.data();
  y.bias_scale = 4.0f;
  y.divisor = 4.0f;
  codec.decompress(bytes.data(), bytes.size(), p, whole(p), y);
  for (int64_t i = 0; i < numel; ++i) {
    const float bias = i < 256 ? 0.5f : -2.0f;
    ASSERT_EQ(out[size_t(i)], (d1[size_t(i)] + 4.0f * bias) / 4.0f);
  }
  for (size_t i = size_t(numel); i < out.size(); ++i) ASSERT_EQ(out[i], 777.0f);
}

TEST(DynamiqCodec, NonFiniteTileGivesNonFiniteSuperGroup) {
  DynamiqCodec codec;
  auto x = gaussian(512, 1);
  x[10] = INFINITY;
  for (int b : {1, 2, 4, 8}) {
    Plan p = uniform_plan(512, b);
    const auto d = decode_f32(codec, p, compress_bucket(codec, p, x.data(), rng_ctx(1, 1)));
    for (int i = 0; i < 256; ++i) ASSERT_FALSE(std::isfinite(d[size_t(i)])) << i;
    for (int i = 256; i < 512; ++i) ASSERT_TRUE(std::isfinite(d[size_t(i)])) << i;
  }
}

// ---- bad input --------------------------------------------------------------------------

TEST(DynamiqCodec, WrongMessageSizeIsMalformed) {
  DynamiqCodec codec;
  const auto x = gaussian(1000, 1);
  Plan p = uniform_plan(1000, 4);
  auto bytes = compress_bucket(codec, p, x.data(), rng_ctx(1, 1));
  std::vector<float> acc(1024);
  Local l;
  l.bucket = x.data();
  std::vector<uint8_t> out(bytes.size());
  Output y;
  std::vector<float> o(1000);
  y.bucket = o.data();
  for (size_t bad : {bytes.size() - 1, bytes.size() + 1, size_t(0)}) {
    EXPECT_THROW(codec.decompress(bytes.data(), bad, p, whole(p), y), MalformedMessage);
    EXPECT_THROW(codec.decompress_accumulate(bytes.data(), bad, l, p, whole(p), acc.data()), MalformedMessage);
    EXPECT_THROW(codec.decompress_accumulate_recompress(bytes.data(), bad, l, p, whole(p),
                                                        rng_ctx(1, 1), out.data()),
                 MalformedMessage);
  }
}

TEST(DynamiqCodec, BadPlansAndParamsAreClearErrors) {
  DynamiqCodec codec;
  Plan p = uniform_plan(1000, 4);
  auto expect_error = [&](Plan q, const char* needle) {
    try {
      codec.static_bytes(q, whole(q));
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Plan q = p;
  q.bits[1] = 3;
  expect_error(q, "width 3");
  q = p;
  q.unit = 128;
  expect_error(q, "plan.unit");
  q = p;
  q.wire_offset[2] += 1;
  expect_error(q, "wire_offset");
  q = p;
  q.order = {0, 1, 2, 9};
  expect_error(q, "order");
  DynamiqParams bad;
  bad.fmt.s = 24;
  EXPECT_THROW(DynamiqCodec{bad}, Error);
  DynamiqParams bad2;
  bad2.eps[3] = 3.0f;  // 8-bit levels collapse in float
  EXPECT_THROW(DynamiqCodec{bad2}, Error);
  RngCtx r = rng_ctx(1, 1, 5, 3);  // rank 5 of 3
  const auto x = gaussian(1000, 1);
  EXPECT_THROW(compress_bucket(codec, p, x.data(), r), Error);
  EXPECT_THROW(compress_bucket(codec, p, x.data(), rng_ctx(1, 1, 0, 70000, true)), Error);
  EXPECT_NO_THROW(compress_bucket(codec, p, x.data(), rng_ctx(1, 1, 0, 70000, false)));
}

// ---- level search ----------------------------------------------------------------------

// The bracket search (cell table + fix-ups) against a linear scan, on every
// level, its float neighbours, and 2^20 log-spaced points, for several eps.
TEST(DynamiqCodec, BracketSearchIsExact) {
  for (float eps : {0.0f, 0.01f, 0.06f, 0.1f, 0.25f, 0.5f})
    for (bool uni : {false, true}) {
      DynamiqParams prm;
      prm.eps = {eps, eps, eps, eps};
      prm.uniform_levels = uni;
      DynamiqTables tb(prm);
      for (int b : {4, 8}) {
        const DqLevels& lv = tb.view().lv[widx(b)];
        auto check = [&](float a) {
          int want = 0;
          while (want + 1 < lv.m && lv.level[want + 1] <= a) ++want;
          const int got = b == 4 ? dq_bracket<4>(lv, a) : dq_bracket<8>(lv, a);
          ASSERT_EQ(got, want) << "b=" << b << " eps=" << eps << " a=" << a;
        };
        for (int j = 0; j <= lv.m; ++j) {
          const float L = lv.level[j];
          check(L);
          check(std::nextafter(L, 0.0f));
          check(std::min(1.0f, std::nextafter(L, 2.0f)));
        }
        for (int k = 0; k < (1 << 20); ++k) check(std::ldexp(1.0f + float(k % 1024) / 1024.0f, -1 - (k / 1024) % 40));
      }
    }
}

// A finite value above the largest finite bf16 (3.3895e38) but below FLT_MAX
// makes a super-group maximum that rounds to inf in bf16: the scale must
// saturate at 0x7f7f so the super-group decodes finite (without it, all of its
// values came out inf or NaN). Every width, hierarchical and flat scales.
TEST(DynamiqEdge, FiniteValuesAboveTheLargestBf16DecodeFinite) {
  for (bool hier : {true, false}) {
    DynamiqParams prm;
    prm.fmt.hierarchical = hier;
    DynamiqCodec codec(prm);
    for (int b : {1, 2, 4, 8}) {
      auto x = gaussian(512, 5);
      x[7] = 3.4e38f;
      Plan p = uniform_plan(512, b, prm.fmt);
      const auto bytes = compress_bucket(codec, p, x.data(), rng_ctx(1, 1));
      const auto d = decode_f32(codec, p, bytes);
      int bad = 0;
      for (float v : d) bad += std::isfinite(v) ? 0 : 1;
      EXPECT_EQ(bad, 0) << "width " << b << (hier ? " hierarchical" : " flat");
    }
  }
}

// The stochastic uint8 group scale (the paper's variant, an option) is unbiased
// to within 2^-16, by enumeration of the random word's top 16 bits rather than
// by sampling (the statistical test sees a bias of 0.02 of a code, not 0.005).
TEST(DynamiqRounding, StochasticGroupScaleUnbiasedByEnumeration) {
  DynamiqTables tb{DynamiqParams{}};
  std::mt19937 gen(4);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  double worst = 0;
  for (int k = 0; k < 200; ++k) {
    const float Msg = 2.0f, g = Msg * U(gen);
    uint64_t sum = 0;
    for (uint32_t h = 0; h < 65536u; ++h) sum += dq_group_scale_stochastic(g, Msg, tb.view().r255, (h << 16) | 0x8000u).r;
    worst = std::max(worst, std::fabs(double(sum) / 65536.0 - 255.0 * double(g) / double(Msg)));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -16) + 1e-4);
}

}  // namespace
}  // namespace dynamiq

namespace dynamiq {
namespace {

// Value rounding draws a 16-bit uniform per element (dynamiq_math.h). Exact
// check by enumeration: over all 2^16 uniforms h and all strata pi of an
// n-rank world, P(round up) differs from p by at most 2^-17 / n (n <= 128;
// 2^-16 / n up to n = 256, 2^-(24 - ceil(log2 n)) / n beyond), for positive and negative
// values, at p on and next to the 2^-16 grid and at random p.
TEST(DynamiqRounding, SixteenBitUniformsAreUnbiasedTo2PowMinus17) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  for (int n : {1, 2, 3, 5, 8, 100, 128, 200, 300}) {
    const DqRounding rd = make_dynamiq_rounding(rng_ctx(1, 1, 0, n, true));
    int k = 0;
    while ((1 << k) < n) ++k;
    // only the stratum pi = floor(p n) has a fractional chance, weighted 1/n;
    // plus the float rounding of p * n (half an ulp of a value < 2^k)
    const double bound = ((n <= 128 ? std::ldexp(1.0, -17) : n <= 256 ? std::ldexp(1.0, -16)
                                                                      : std::ldexp(1.0, -(24 - k))) +
                          (n > 1 ? std::ldexp(1.0, k - 25) : 0.0)) / n;
    std::vector<float> ps = {0.0f, 1.0f, 0.5f, 1e-7f, 1.0f - 1e-7f};
    for (int g : {1, 2, 777, 65535}) {
      const float c = std::ldexp(float(g), -16), h = std::ldexp(1.0f, -18);
      ps.insert(ps.end(), {c, c - h, c + h, std::nextafter(c, 0.0f)});
    }
    for (int r = 0; r < 6; ++r) ps.push_back(U(gen));
    double worst = 0;
    for (float p : ps)
      for (uint32_t neg : {0u, 1u}) {
        uint64_t ups = 0;
        for (int pi = 0; pi < n; ++pi)
          for (uint32_t h = 0; h < 65536u; ++h) ups += dq_round_up(p, float(pi), dq_u16_word(h), neg, rd);
        const double err = std::fabs(double(ups) / (65536.0 * n) - double(p));
        worst = std::max(worst, err);
        ASSERT_LE(err, bound * (1 + 1e-9)) << "n=" << n << " p=" << p << " neg=" << neg;
      }
    // and the grid is really that coarse: with one stratum some p misses by more
    // than a 24-bit uniform would allow (so the test would notice a change of draw)
    if (n == 1) {
      EXPECT_GT(worst, std::ldexp(1.0, -19));
    }
  }
}

// The S rounding uniforms of an SG are the 2 x 4 x S/8 halves of its S/8
// Philox calls, each used exactly once; the permutation words stay whole words.
TEST(DynamiqRounding, ValueUniformsUseEveryHalfWordOnce) {
  const RngKey key = make_rng_key(3, 4);
  for (int S : {8, 64, 256, 1024})
    for (int64_t src : {int64_t(0), int64_t(5), (int64_t(1) << 31) + 7}) {
      std::map<uint32_t, int> want, got;
      const int q = S / 8;
      for (int c = 0; c < q; ++c) {
        const Philox4x32 r = dq_draw(key, uint64_t(src) * uint64_t(q) + uint64_t(c), kPurposeValue, 9);
        for (int j = 0; j < 4; ++j) {
          ++want[dq_u16_word(r.v[j] & 0xffffu)];
          ++want[dq_u16_word(r.v[j] >> 16)];
        }
      }
      for (int i = 0; i < S; ++i) ++got[dq_value_word(key, kPurposeValue, 9, src, S, i)];
      ASSERT_EQ(got, want) << "S=" << S << " src=" << src;
      EXPECT_EQ(dq_word32(key, kPurposePermutation, 0, src, S, 5),
                dq_draw(key, uint64_t(src) * uint64_t(S / 4) + 1, kPurposePermutation, 0).v[1]);
    }
}

// The RNG layout of README.md ("Randomness"), element by element from plain
// Philox4x32-10 calls: element i of SG src rounds with the low (i % 8 < 4) or
// high 16 bits of word i % 4 of value call src*S/8 + i/8, and takes word i % 4
// of permutation call src*S/4 + i/4; group k's scale word is word k % 4 of
// call src*ceil(G/4) + k/4. So the 8 contiguous elements of an octet share
// one value call and two permutation calls.
TEST(DynamiqRounding, RngLayoutIsOneCallPerOctet) {
  const RngKey key = make_rng_key(11, 12);
  auto call = [&](uint64_t c, uint32_t purpose, uint32_t who) {
    return philox4x32_10(uint32_t(c), purpose, who, uint32_t(c >> 32), key.k0, key.k1);
  };
  for (int S : {8, 24, 256, 1024})
    for (int64_t src : {int64_t(0), int64_t(3), (int64_t(1) << 31) + 5}) {
      for (int i = 0; i < S; ++i) {
        const Philox4x32 v = call(uint64_t(src) * uint64_t(S / 8) + uint64_t(i / 8), kPurposeValue, 6);
        const uint32_t word = v.v[i % 4];
        const uint32_t half = i % 8 < 4 ? (word & 0xffffu) : (word >> 16);
        ASSERT_EQ(dq_value_word(key, kPurposeValue, 6, src, S, i), (half << 16) | 0x8000u)
            << "S=" << S << " src=" << src << " i=" << i;
        const Philox4x32 p = call(uint64_t(src) * uint64_t(S / 4) + uint64_t(i / 4), kPurposePermutation, 0);
        ASSERT_EQ(dq_word32(key, kPurposePermutation, 0, src, S, i), p.v[i % 4]) << "S=" << S << " i=" << i;
      }
      const int G = S / 8 + 3;  // not a multiple of 4
      for (int k = 0; k < G; ++k) {
        const Philox4x32 g = call(uint64_t(src) * uint64_t((G + 3) / 4) + uint64_t(k / 4), kPurposeGroupScale, 6);
        ASSERT_EQ(dq_group_word(key, 6, src, G, k), g.v[k % 4]) << "G=" << G << " k=" << k;
      }
    }
}

// The CPU kernels' word filler (AVX2 Philox when built for x86-64-v3) equals
// the scalar Philox of philox.h, including across a 2^32 counter boundary.
TEST(DynamiqKernels, Avx2PhiloxMatchesScalar) {
  const RngKey key = make_rng_key(77, 88);
  for (const std::string& isa : available_cpu_isas()) {
  const IsaScope scope(isa);
  for (int S : {256, 128, 64, 8})
    for (uint64_t call0 : {uint64_t(0), uint64_t(12345), (uint64_t(1) << 32) - 10, (uint64_t(5) << 32) + 3}) {
      std::vector<uint32_t> w(static_cast<size_t>(S));
      dynamiq_fill_words(key, call0, kPurposeValue, 3, S, w.data());
      const int q = S / 4;
      for (int k = 0; k < q; ++k) {
        const Philox4x32 r = philox4x32_10(uint32_t(call0 + uint64_t(k)), kPurposeValue, 3,
                                           uint32_t((call0 + uint64_t(k)) >> 32), key.k0, key.k1);
        for (int j = 0; j < 4; ++j)
          ASSERT_EQ(w[size_t(4 * k + j)], r.v[j]) << isa << " S=" << S << " k=" << k;
      }
    }
  }
}

// dynamiq_cpu_isa() names the kernels that run: "generic" in a build without
// AVX2 (DYNAMIQ_CPU_ARCH empty, or not x86-64: the #if defined(__AVX2__)
// kernels are not compiled in and the scalar ones run), "avx2" with it, or
// "avx512" in a build with AVX-512 kernels (none at present: an AVX-512 CPU
// runs the AVX2 ones, which this test checks on such a CPU). This file is compiled with the kernels' -march flags, so its
// __AVX2__ is theirs. dynamiq_set_cpu_isa accepts the build's baseline (and
// whatever it returned), rejects the other baseline and unknown names.
TEST(DynamiqKernels, CpuIsaNamesTheKernelsCompiledIn) {
  const std::string before = dynamiq_set_cpu_isa("auto");
  const std::string isa = dynamiq_cpu_isa();
#if defined(__AVX2__) && !defined(DQ_HAVE_AVX512)
  // no AVX-512 kernels compiled in: AVX2 whatever the CPU, and asking for
  // AVX-512 is refused (DYNAMIQ_CPU_ISA=avx512 picks by CPU: AVX2 too)
  EXPECT_EQ(isa, "avx2");
  EXPECT_THROW(dynamiq_set_cpu_isa("avx512"), Error);
  EXPECT_EQ(dynamiq_cpu_isa(), "avx2");
#endif
#if defined(__AVX2__)
  EXPECT_TRUE(isa == "avx2" || isa == "avx512") << isa;
  EXPECT_EQ(dynamiq_set_cpu_isa("avx2"), isa);
  EXPECT_EQ(dynamiq_cpu_isa(), "avx2");
  EXPECT_THROW(dynamiq_set_cpu_isa("generic"), Error);
  EXPECT_EQ(dynamiq_cpu_isa(), "avx2");
  EXPECT_EQ(available_cpu_isas().front(), "avx2");
#else
  EXPECT_EQ(isa, "generic");
  EXPECT_THROW(dynamiq_set_cpu_isa("avx2"), Error);
  EXPECT_THROW(dynamiq_set_cpu_isa("avx512"), Error);  // AVX-512 kernels need an AVX2 build
  EXPECT_EQ(dynamiq_set_cpu_isa("generic"), "generic");
  EXPECT_EQ(dynamiq_cpu_isa(), "generic");
  EXPECT_EQ(available_cpu_isas(), std::vector<std::string>{"generic"});
#endif
  EXPECT_THROW(dynamiq_set_cpu_isa("sse4"), Error);
  EXPECT_EQ(dynamiq_set_cpu_isa(isa), dynamiq_cpu_isa());  // the detected ISA is accepted back
  EXPECT_EQ(dynamiq_cpu_isa(), isa);
  dynamiq_set_cpu_isa(before);
}

}  // namespace
}  // namespace dynamiq

namespace dynamiq {
namespace {

using namespace dqtest;

// stochastic = false (ablation): round to the nearest level, deterministic
// (no dependence on the key), |x^ - x| <= D/2 * sc_k.
TEST(DynamiqCodec, NearestRoundingIsDeterministicAndWithinHalfAGap) {
  DynamiqCodec codec;
  const auto x = gaussian(3000, 8);
  for (int b : {2, 4, 8}) {
    Plan p = uniform_plan(3000, b);
    RngCtx r1 = rng_ctx(1, 1), r2 = rng_ctx(2, 9, 1, 4, true);
    r1.stochastic = r2.stochastic = false;
    const auto b1 = compress_bucket(codec, p, x.data(), r1), b2 = compress_bucket(codec, p, x.data(), r2);
    EXPECT_EQ(b1, b2);
    const auto d = decode_f32(codec, p, b1);
    const auto L = paper_levels(b, codec.params().eps[size_t(b == 2 ? 1 : b == 4 ? 2 : 3)], false);
    double D = 0;
    for (size_t j = 0; j + 1 < L.size(); ++j) D = std::max(D, L[j + 1] - L[j]);
    for (size_t g0 = 0; g0 < x.size(); g0 += 16) {
      const uint8_t* sg = b1.data() + (g0 / 256) * size_t(dynamiq_sg_bytes(b, codec.params().fmt));
      const double sc = double(float(sg[2 + (g0 % 256) / 16] / 255.0) * bf16_le(sg));
      for (size_t i = g0; i < std::min(x.size(), g0 + 16); ++i)
        ASSERT_LE(std::fabs(double(d[i]) - x[i]), D / 2 * sc * (1 + 1e-5) + 1e-30) << "width " << b << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace dynamiq

namespace dynamiq {
namespace {

// DynamiqTables' view points into its own byte image: a copy (and a
// copy-assignment) must point into the copy's image and stay valid after the
// original is gone (ASan catches a dangling view in the sanitizer build).
TEST(DynamiqTables, CopiesPointIntoTheirOwnImage) {
  DynamiqParams prm;
  prm.eps[3] = 0.1f;  // not the default, so a copy of a default-built table could not pass
  const DynamiqTables ref(prm);
  auto check = [&](const DynamiqTables& t) {
    const uint8_t* lo = t.image().data();
    const uint8_t* hi = lo + t.image().size();
    for (int wi = 0; wi < 4; ++wi) {
      const DqLevels& a = t.view().lv[wi];
      const DqLevels& b = ref.view().lv[wi];
      ASSERT_EQ(a.m, b.m);
      for (const void* p : {static_cast<const void*>(a.level), static_cast<const void*>(a.decode)}) {
        const uint8_t* q = static_cast<const uint8_t*>(p);
        EXPECT_TRUE(q >= lo && q < hi) << "width index " << wi;
      }
      for (int j = 0; j <= a.m; ++j) EXPECT_EQ(a.level[j], b.level[j]);
      for (int c = 0; c < (1 << a.width) && a.width > 1; ++c) EXPECT_EQ(a.decode[c], b.decode[c]);
    }
  };
  auto original = std::make_unique<DynamiqTables>(prm);
  DynamiqTables copy(*original);
  DynamiqTables assigned(DynamiqParams{});
  assigned = *original;
  original.reset();
  check(copy);
  check(assigned);
}

}  // namespace
}  // namespace dynamiq
