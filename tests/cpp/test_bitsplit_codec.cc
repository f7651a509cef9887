// The bit-split codec on its own: wire size against the paper's table 4,
// plane packing, the documented layout, spike reserving, error bounds,
// unbiasedness of stochastic rounding, the fused role, malformed input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/bitsplit/bitsplit_format.h"
#include "kernels/base/float_bits.h"
#include "test_bitsplit_util.h"

namespace dynamiq {
namespace {

using namespace bstest;

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

BitsplitCodec codec_of(int bits, int group, bool spikes, bool log_scales) {
  BitsplitParams p;
  p.bits = bits;
  p.group = group;
  p.spikes = spikes;
  p.log_scales = log_scales;
  return BitsplitCodec(p);
}

// ---- accounting ----------------------------------------------------------------------

TEST(BitsplitAccounting, Table4ReferenceReproducesThePaper) {
  // 4096 float16 numbers, INT2, groups of 32 (table 4). Row "scale": bf16
  // scale, zero, spikes and (per the text) bf16 indices; row "scale_int":
  // 1-byte scale and zero, bf16 spikes, INT8 indices.
  Table4 a = paper_table4(4096, 2, 32, true, 2, 2, 2, 2);
  EXPECT_EQ(a.quantized, 1024);
  EXPECT_EQ(a.scale_zero, 512);
  EXPECT_EQ(a.spikes, 1024);
  EXPECT_EQ(a.meta, 1536);
  EXPECT_EQ(a.total, 2560);
  Table4 b = paper_table4(4096, 2, 32, true, 1, 1, 2, 1);
  EXPECT_EQ(b.quantized, 1024);
  EXPECT_EQ(b.scale_zero, 256);
  EXPECT_EQ(b.spikes, 768);
  EXPECT_EQ(b.meta, 1024);
  EXPECT_EQ(b.total, 2048);
}

TEST(BitsplitAccounting, Table4RowScaleIntIsExactlyTheWireSize) {
  // The paper's configuration: fp16 data, INT2, G = 32, spike reserving,
  // integer log scales: 2048 bytes for 4096 numbers.
  BitsplitCodec c = codec_of(2, 32, true, true);
  Plan plan = c.make_plan(DType::kF16, 4096, 1);
  EXPECT_EQ(c.static_bytes(plan, Block{0, plan.num_units}), 2048u);
}

TEST(BitsplitAccounting, WireSizeEqualsTable4ForEverySetting) {
  for (int bits = 2; bits <= 8; ++bits)
    for (int G : {32, 64, 96, 128, 256})
      for (bool sr : {false, true})
        for (bool lg : {false, true})
          for (DType dt : kDTypes)
            for (int64_t numel : {int64_t(1), int64_t(G), int64_t(4096), int64_t(100003)}) {
              BitsplitCodec c = codec_of(bits, G, sr, lg);
              Plan plan = c.make_plan(dt, numel, 1);
              const int64_t want = accounted_bytes(numel, bits, G, sr, lg, dt);
              EXPECT_EQ(int64_t(c.static_bytes(plan, Block{0, plan.num_units})), want)
                  << "bits=" << bits << " G=" << G << " sr=" << sr << " log=" << lg
                  << " dtype=" << dtype_name(dt) << " numel=" << numel;
              EXPECT_EQ(plan.wire_offset.back(), want);
              // Per-unit offsets are the accounting of the elements before them.
              for (int64_t w = 0; w <= plan.num_units; ++w)
                ASSERT_EQ(plan.wire_offset[size_t(w)],
                          accounted_bytes(std::min(w * plan.unit, numel), bits, G, sr, lg, dt));
            }
}

TEST(BitsplitAccounting, DefaultsFollowThePaper) {
  for (int bits = 2; bits <= 8; ++bits) {
    BitsplitParams p = resolve_bitsplit_params(bits, 0, -1, false);
    EXPECT_EQ(p.group, bits >= 5 ? 128 : 32) << bits;
    EXPECT_EQ(p.spikes, bits <= 3) << bits;
    EXPECT_TRUE(resolve_bitsplit_params(bits, 64, 1, false).spikes);
    EXPECT_FALSE(resolve_bitsplit_params(bits, 64, 0, false).spikes);
  }
}

TEST(BitsplitAccounting, BadKnobsAreNamed) {
  auto msg = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([] { resolve_bitsplit_params(1, 0, -1, false); }).find("bits=1"), std::string::npos);
  EXPECT_NE(msg([] { resolve_bitsplit_params(9, 0, -1, false); }).find("integer width 2..8"),
            std::string::npos);
  EXPECT_NE(msg([] { resolve_bitsplit_params(4.5, 0, -1, false); }).find("bits=4.5"),
            std::string::npos);
  EXPECT_NE(msg([] { resolve_bitsplit_params(4, 48, -1, false); }).find("group_size=48"),
            std::string::npos);
  EXPECT_NE(msg([] { resolve_bitsplit_params(4, 512, -1, false); }).find("group_size=512"),
            std::string::npos);
  EXPECT_NE(msg([] { resolve_bitsplit_params(4, 0, 2, false); }).find("spike_reserve=2"),
            std::string::npos);
}

// ---- planes -----------------------------------------------------------------------------

TEST(BitsplitPlanes, SplitsAreThePapersRegularWidths) {
  for (int bits = 2; bits <= 8; ++bits) {
    const std::vector<int> want = plane_widths(bits);
    ASSERT_EQ(bitsplit_num_planes(bits), int(want.size())) << bits;
    int sum = 0;
    for (int p = 0; p < bitsplit_num_planes(bits); ++p) {
      EXPECT_EQ(bitsplit_plane_width(bits, p), want[size_t(p)]);
      sum += want[size_t(p)];
    }
    EXPECT_EQ(sum, bits);
  }
}

TEST(BitsplitPlanes, PackUnpackEveryWidthAndShiftBitExact) {
  // Every field value at every slot position of a word, for every width and
  // every shift a plane can have inside an 8-bit code.
  std::mt19937 g(5);
  for (int W : {1, 2, 4, 8})
    for (int shift = 0; shift + W <= 8; ++shift) {
      const int n = 32 * 9;
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        // slot i carries field value i mod 2^W in its field, noise elsewhere
        const uint32_t field = uint32_t(i) & ((1u << W) - 1u);
        const uint32_t noise = g() & ~(((1u << W) - 1u) << shift) & 0xffu;
        codes[size_t(i)] = uint8_t((field << shift) | noise);
      }
      std::vector<uint8_t> plane(static_cast<size_t>(n * W / 8), 0xee);
      bitsplit_pack_plane(codes.data(), n, W, shift, plane.data());
      // Reference positions: slot i at plane bit i*W, least significant first.
      for (int i = 0; i < n; ++i) {
        const int bit = i * W;
        const uint32_t got = (uint32_t(plane[size_t(bit / 8)]) >> (bit % 8)) & ((1u << W) - 1u);
        ASSERT_EQ(got, uint32_t(i) & ((1u << W) - 1u)) << "W=" << W << " shift=" << shift << " i=" << i;
      }
      std::vector<uint8_t> back(static_cast<size_t>(n), 0);
      bitsplit_unpack_plane(plane.data(), n, W, shift, back.data());
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(back[size_t(i)], uint8_t((uint32_t(i) & ((1u << W) - 1u)) << shift));
    }
}

// Groups whose values are integers 0..L with both 0 and L present: the bf16
// scale is exactly 1 and the zero exactly 0, so nearest rounding must put
// every value's integer on the wire as its code. Every code value of every
// width appears; the last group is partial.
TEST(BitsplitPlanes, EveryCodeValueOfEveryWidthThroughTheDocumentedLayout) {
  for (int bits = 2; bits <= 8; ++bits)
    for (int G : {32, 128, 160})
      for (DType dt : kDTypes) {
        const int L = (1 << bits) - 1;
        const int64_t groups = std::max<int64_t>(3, 2 * (L + 1) / G + 2);
        const int64_t numel = (groups - 1) * G + 17;  // partial last group
        std::vector<float> v(static_cast<size_t>(numel));
        std::set<int> seen;
        int next = 0;
        for (int64_t i = 0; i < numel; ++i) {
          const int64_t s = i % G;
          const int q = s == 0 ? 0 : s == 1 ? L : (next++ * 7) % (L + 1);
          v[size_t(i)] = float(q);
          seen.insert(q);
        }
        ASSERT_EQ(int(seen.size()), L + 1);
        BitsplitCodec c = codec_of(bits, G, false, false);
        Bucket b = make_bucket(dt, v);
        auto msg = compress_all(c, b, rng_ctx(1, 2, 0, false));
        auto parsed = parse_message(msg, groups, bits, G, false, false, dt);
        for (int64_t i = 0; i < groups * G; ++i) {
          const auto& pg = parsed[size_t(i / G)];
          const uint32_t want = i < numel ? uint32_t(v[size_t(i)]) : 0u;
          ASSERT_EQ(pg.codes[size_t(i % G)], want)
              << "bits=" << bits << " G=" << G << " dtype=" << dtype_name(dt) << " slot " << i;
        }
        for (const auto& pg : parsed) {
          ASSERT_EQ(pg.raw0, 0x3f80) << "scale must be bf16 1.0";
          ASSERT_EQ(pg.raw1, 0x0000) << "zero must be bf16 0.0";
        }
        auto y = decompress_all(c, dt, numel, msg);
        for (int64_t i = 0; i < numel; ++i) ASSERT_EQ(y[size_t(i)], v[size_t(i)]);
      }
}

// ---- the codec against the parsed message -------------------------------------------------

// For random data: the parser's reading of the message, decoded in double,
// agrees with decompress; every value is within one step (stochastic) or
// half a step (nearest) of its input; the grid covers the group's range.
TEST(BitsplitCodec, DecodeMatchesReferenceAndErrorWithinOneStep) {
  for (int bits : {2, 3, 5, 7, 8})
    for (bool sr : {false, true})
      for (bool lg : {false, true})
        for (bool stoch : {false, true})
          for (DType dt : kDTypes) {
            const int G = bits >= 5 ? 128 : 32;
            const int64_t numel = 3 * 1024 + 7 * G + 5;
            auto v = gaussian(numel, uint32_t(bits * 100 + sr * 10 + lg), 0.01f);
            Bucket b = make_bucket(dt, v);
            const std::vector<float> x = b.values();
            BitsplitCodec c = codec_of(bits, G, sr, lg);
            auto msg = compress_all(c, b, rng_ctx(3, 4, 1, stoch));
            const int64_t ng = (numel + G - 1) / G;
            auto parsed = parse_message(msg, ng, bits, G, sr, lg, dt);
            auto y = decompress_all(c, dt, numel, msg);
            const int L = (1 << bits) - 1;
            for (int64_t gi = 0; gi < ng; ++gi) {
              const auto& pg = parsed[size_t(gi)];
              const int64_t e = gi * G, cnt = std::min<int64_t>(G, numel - e);
              double lo = 1e30, hi = -1e30;
              for (int64_t i = 0; i < cnt; ++i) {
                if (sr && (i == pg.imin || i == pg.imax)) continue;
                lo = std::min(lo, double(x[size_t(e + i)]));
                hi = std::max(hi, double(x[size_t(e + i)]));
              }
              if (lo > hi) lo = hi = 0;
              // The grid covers [lo, hi].
              ASSERT_LE(double(pg.zero), lo + 1e-12);
              ASSERT_GE(double(pg.zero) + L * double(pg.scale), hi - 1e-6 * std::abs(hi) - 1e-12);
              for (int64_t i = 0; i < cnt; ++i) {
                const float got = y[size_t(e + i)];
                if (sr && (i == pg.imin || i == pg.imax)) continue;
                const double ref = double(pg.zero) + double(pg.codes[size_t(i)]) * double(pg.scale);
                const double ulp16 = dt == DType::kF32 ? 0.0 : std::abs(ref) * (dt == DType::kBF16 ? 0x1p-8 : 0x1p-11);
                // (relative to the terms: the parser's zero and scale are rounded differently)
                const double terms = std::abs(double(pg.zero)) + double(pg.codes[size_t(i)]) * double(pg.scale);
                ASSERT_NEAR(got, ref, 1e-6 * terms + 1e-12 + ulp16);
                const double step = stoch ? double(pg.scale) : 0.5 * double(pg.scale);
                ASSERT_LE(std::abs(double(got) - double(x[size_t(e + i)])),
                          step * (1 + 1e-5) + ulp16 + 1e-12)
                    << "bits=" << bits << " sr=" << sr << " log=" << lg << " group " << gi;
              }
            }
          }
}

TEST(BitsplitCodec, ScalesAreTight) {
  // bf16 scales: zero is lo rounded down to bf16 and scale (hi - zero)/L rounded
  // up (each by less than one bf16 ulp, 2^-7 relative), so
  // scale <= (hi - lo + |lo| 2^-7)/L * (1 + 2^-7). Log scales: within
  // one theta step (2^0.1) of the smallest admissible scale, whose range grows
  // by at most the 1/64 zero step.
  for (bool lg : {false, true}) {
    const int bits = 4, G = 32;
    const int64_t numel = 32 * 500;
    auto v = gaussian(numel, 11, 3.0f);
    BitsplitCodec c = codec_of(bits, G, false, lg);
    Bucket b = make_bucket(DType::kF32, v);
    auto msg = compress_all(c, b, rng_ctx(0, 0, 0, true));
    auto parsed = parse_message(msg, numel / G, bits, G, false, lg, DType::kF32);
    const int L = 15;
    for (int64_t gi = 0; gi < numel / G; ++gi) {
      double lo = 1e30, hi = -1e30;
      for (int i = 0; i < G; ++i) {
        lo = std::min(lo, double(v[size_t(gi * G + i)]));
        hi = std::max(hi, double(v[size_t(gi * G + i)]));
      }
      const double s = parsed[size_t(gi)].scale;
      const double bound = lg ? (hi - lo) / L * (1.0 + 1.0 / 64) / (1 - 1.0 / 64) * std::pow(2.0, 0.1)
                              : (hi - lo + std::abs(lo) / 128) / L * (1 + 1.0 / 128);
      ASSERT_LE(s, bound * (1 + 1e-6)) << "group " << gi << " log=" << lg;
    }
  }
}

// The grid of every chosen (scale, zero) covers [lo, hi] in the decoder's own
// arithmetic, for ranges across magnitudes, signs and tiny relative spreads
// (the cases where the float subtraction and division round): the claim that
// one bf16 raise suffices, and the log-scale search.
TEST(BitsplitCodec, ChosenGridCoversTheRangeEverywhere) {
  std::mt19937_64 g(99);
  std::uniform_real_distribution<double> ex(-30, 30), sp(-24, 2), un(0, 1);
  for (int bits = 2; bits <= 8; ++bits)
    for (bool lg : {false, true}) {
      BitsplitFormat f;
      f.bits = bits;
      f.log_scales = lg;
      const float Lf = float(f.levels());
      for (int it = 0; it < 20002; ++it) {
        const double mag = std::pow(2.0, lg ? ex(g) / 1.5 : ex(g));  // log scales span 2^+-25
        const int kind = it < 2 ? 4 + it : it % 4;
        float lo, hi;
        if (kind >= 4) {  // hi - lo rounds down to L and L/L = 1 is a bf16: needs the raise
          lo = -Lf;
          hi = kind == 4 ? 0x1p-30f : 1e-20f;
        } else if (kind == 0) {  // straddles zero
          lo = float(-mag * un(g));
          hi = float(mag * un(g));
        } else if (kind == 1) {  // positive, tiny relative spread
          lo = float(mag);
          hi = float(mag * (1 + std::pow(2.0, sp(g))));
        } else if (kind == 2) {  // negative, tiny spread
          hi = float(-mag);
          lo = float(-mag * (1 + std::pow(2.0, sp(g))));
        } else {  // constant
          lo = hi = float(mag * (un(g) - 0.5));
        }
        if (lo > hi) std::swap(lo, hi);
        BitsplitGroup grp;
        bitsplit_choose_scales(f, lo, hi, grp);
        ASSERT_LE(grp.zero, lo) << "bits=" << bits << " log=" << lg << " [" << lo << ", " << hi << "]";
        ASSERT_GE(bitsplit_dequant(uint32_t(f.levels()), grp.zero, grp.scale), hi)
            << "bits=" << bits << " log=" << lg << " [" << lo << ", " << hi << "]";
        if (!lg) {  // at most one bf16 ulp above the rounded-up quotient
          const float q = (hi - grp.zero) / Lf;
          ASSERT_LE(grp.scale, bf16_to_f32(uint16_t(bf16_bits_up_pos(q) + 1)));
        }
      }
    }
}

// ---- spike reserving ----------------------------------------------------------------------

TEST(BitsplitSpikes, MinAndMaxOfEveryGroupComeBackExactly) {
  for (int bits = 2; bits <= 8; ++bits)
    for (DType dt : kDTypes)
      for (bool lg : {false, true})
        for (bool stoch : {false, true}) {
          const int G = bits <= 4 ? 32 : 128;
          const int64_t numel = 40 * G + 19;
          auto v = gaussian(numel, uint32_t(bits + 7), 1.0f);
          std::mt19937 g(bits);
          for (int64_t i = 0; i < numel; i += 13) v[size_t(i)] *= float(1 + g() % 100);  // spikes
          Bucket b = make_bucket(dt, v);
          const auto x = b.values();
          BitsplitCodec c = codec_of(bits, G, true, lg);
          auto msg = compress_all(c, b, rng_ctx(9, 1, 2, stoch));
          auto y = decompress_all(c, dt, numel, msg);
          for (int64_t e = 0; e < numel; e += G) {
            const int64_t cnt = std::min<int64_t>(G, numel - e);
            auto first = x.begin() + e, last = x.begin() + e + cnt;
            const int64_t imin = std::min_element(first, last) - x.begin();
            const int64_t imax = std::max_element(first, last) - x.begin();
            ASSERT_EQ(f32_bits(y[size_t(imin)]), f32_bits(x[size_t(imin)]))
                << "bits=" << bits << " dtype=" << dtype_name(dt) << " group at " << e;
            ASSERT_EQ(f32_bits(y[size_t(imax)]), f32_bits(x[size_t(imax)]));
          }
        }
}

// Gaussian groups of 32 with one planted outlier of +-50 sigma each.
// Measured on this data: nearest plain INT2 0.0712, INT2+SR 0.00147 (48x);
// stochastic 0.390 vs 0.00292 (134x): the outlier no longer sets the step of
// the other 31 values. Asserted: SR at least 20x lower.
TEST(BitsplitSpikes, PlantedOutliersInt2WithSpikesBeatsPlainInt2) {
  const int64_t numel = 32 * 4096;
  auto v = gaussian(numel, 21, 1.0f);
  std::mt19937 g(4);
  for (int64_t e = 0; e < numel; e += 32) v[size_t(e + g() % 32)] = (g() & 1) ? 50.0f : -50.0f;
  Bucket b = make_bucket(DType::kF32, v);
  for (bool stoch : {false, true}) {
    auto plain = decompress_all(codec_of(2, 32, false, false), DType::kF32, numel,
                                compress_all(codec_of(2, 32, false, false), b, rng_ctx(1, 1, 0, stoch)));
    auto sr = decompress_all(codec_of(2, 32, true, false), DType::kF32, numel,
                             compress_all(codec_of(2, 32, true, false), b, rng_ctx(1, 1, 0, stoch)));
    const double e_plain = vnmse(v, plain), e_sr = vnmse(v, sr);
    RecordProperty(stoch ? "vnmse_plain_stochastic" : "vnmse_plain_nearest", fmt_g(e_plain));
    RecordProperty(stoch ? "vnmse_sr_stochastic" : "vnmse_sr_nearest", fmt_g(e_sr));
    EXPECT_LT(e_sr * 20, e_plain) << "stochastic=" << stoch << " plain " << e_plain << " sr " << e_sr;
  }
}

// ---- error bounds ---------------------------------------------------------------------------

// INT8, groups of 128, bf16 scales, N(0,1) data. Derivation: with R the range
// of a group, the zero is the min rounded down to bf16 (moves by < |min| 2^-7
// <= R 2^-7 when the group straddles 0) and the scale is rounded up to bf16
// (< 2^-7 relative), so the step is s <= R (1 + 2^-7)^2 / 255. At 255 levels
// the position of a value inside its step is uniform, so the error variance is
// s^2/12 for nearest and E[f(1-f)] s^2 = s^2/6 for stochastic rounding. For
// n = 128 standard normals E[R^2] = 27.28 (2M-sample simulation: mean range
// 5.190, sd 0.590), so
//   vNMSE_nearest    <= 27.28 * (1 + 2^-7)^4 / 255^2 / 12 = 3.61e-5
//   vNMSE_stochastic <= 2 * 3.61e-5 = 7.21e-5.
// The roundings average half their worst case and each group's min and max
// sit on grid points, so the measured value is a few percent lower. Asserted:
// within [0.85, 1.02] of the bound; with 8192 groups the sampling noise of
// the mean s^2 is ~0.3%.
TEST(BitsplitError, Int8GaussianVnmseMatchesTheDerivedBound) {
  const int64_t numel = int64_t(128) * 8192;
  auto v = gaussian(numel, 77, 1.0f);
  Bucket b = make_bucket(DType::kF32, v);
  BitsplitCodec c = codec_of(8, 128, false, false);
  const double bound_nearest = 27.28 * std::pow(1 + 0x1p-7, 4) / (255.0 * 255.0) / 12.0;
  for (bool stoch : {false, true}) {
    auto y = decompress_all(c, DType::kF32, numel, compress_all(c, b, rng_ctx(5, 5, 0, stoch)));
    const double e = vnmse(v, y);
    const double bound = stoch ? 2 * bound_nearest : bound_nearest;
    RecordProperty(stoch ? "vnmse_stochastic" : "vnmse_nearest", fmt_g(e));
    EXPECT_LE(e, 1.02 * bound) << "stochastic=" << stoch;
    EXPECT_GE(e, 0.85 * bound) << "stochastic=" << stoch;
  }
}

// ---- rounding -------------------------------------------------------------------------------

// K independent compressions (different Philox keys) of the same groups. Each
// decoded value is a two-point variable with mean x (if unbiased) and standard
// deviation s sqrt(f(1-f)) <= s/2, so the mean of K draws deviates from x by
// more than 5.3 (s/2)/sqrt(K) with probability < 1.2e-7 per element; over the
// 200 non-spike elements here the family-wise false alarm rate is < 2.4e-5.
// The same statistic must reject nearest rounding (which is biased by up to
// s/2), so the test can fail.
TEST(BitsplitRounding, StochasticIsUnbiasedNearestIsNot) {
  const int K = 3000;
  for (bool sr : {false, true})
    for (bool lg : {false, true}) {
      const int G = 32;
      const int64_t numel = 6 * G + 21;
      auto v = gaussian(numel, 8, 1.0f);
      Bucket b = make_bucket(DType::kF32, v);
      BitsplitCodec c = codec_of(2, G, sr, lg);
      auto parsed = parse_message(compress_all(c, b, rng_ctx(0, 0, 0, true)), (numel + G - 1) / G, 2,
                                  G, sr, lg, DType::kF32);
      for (bool stoch : {true, false}) {
        std::vector<double> mean(static_cast<size_t>(numel), 0.0);
        for (int k = 0; k < K; ++k) {
          auto y = decompress_all(c, DType::kF32, numel,
                                  compress_all(c, b, rng_ctx(1234, uint64_t(k), 3, stoch)));
          for (int64_t i = 0; i < numel; ++i) mean[size_t(i)] += y[size_t(i)];
        }
        int rejected = 0;
        double worst = 0;
        for (int64_t i = 0; i < numel; ++i) {
          const auto& pg = parsed[size_t(i / G)];
          const double s = pg.scale;
          const double dev = std::abs(mean[size_t(i)] / K - double(v[size_t(i)]));
          const double tol = 5.3 * (s / 2) / std::sqrt(double(K));
          worst = std::max(worst, dev / tol);
          if (dev > tol) ++rejected;
        }
        if (stoch)
          EXPECT_EQ(rejected, 0) << "sr=" << sr << " log=" << lg << " worst dev/tol " << worst;
        else
          EXPECT_GT(rejected, 20) << "nearest should be visibly biased; sr=" << sr << " log=" << lg;
      }
    }
}

// Groups whose scale is below 2^-128, where 1/scale overflows float: INT8 on
// values of size 1e-37 (normal floats) and INT2/INT8 on 1e-40 (subnormal).
// Every element within one step of its value, finite, and the stochastic
// codes unbiased (before the fix: mean off by several times the values).
TEST(BitsplitRounding, TinyScalesStayWithinAStepAndUnbiased) {
  const int K = 2000;
  const int G = 32;
  const int64_t numel = 4 * G + 9;
  for (int bits : {2, 8})
    for (float mag : {1e-37f, 1e-40f})
      for (bool sr : {false, true}) {
        if (bits == 2 && mag > 1e-38f) continue;  // INT2's scale is not below 2^-128 there
        auto v = gaussian(numel, 21, mag);
        v[5] = 0.0f;
        Bucket b = make_bucket(DType::kF32, v);
        BitsplitCodec c = codec_of(bits, G, sr, false);
        const std::string what = "bits=" + std::to_string(bits) + " mag=" + fmt_g(mag) +
                                 " sr=" + std::to_string(sr);
        auto parsed = parse_message(compress_all(c, b, rng_ctx(0, 0, 0, true)), (numel + G - 1) / G,
                                    bits, G, sr, false, DType::kF32);
        ASSERT_LT(parsed[0].scale, std::ldexp(1.0, -128)) << what << ": not a tiny scale";
        std::vector<double> mean(size_t(numel), 0.0);
        for (int k = 0; k < K; ++k) {
          auto y = decompress_all(c, DType::kF32, numel, compress_all(c, b, rng_ctx(99, uint64_t(k), 1, true)));
          for (int64_t i = 0; i < numel; ++i) {
            const double s = parsed[size_t(i / G)].scale;
            ASSERT_TRUE(std::isfinite(y[size_t(i)])) << what;
            ASSERT_LE(std::abs(double(y[size_t(i)]) - v[size_t(i)]), s * 1.0001) << what << " i=" << i;
            mean[size_t(i)] += y[size_t(i)];
          }
        }
        for (int64_t i = 0; i < numel; ++i) {
          const double s = parsed[size_t(i / G)].scale;
          EXPECT_LE(std::abs(mean[size_t(i)] / K - double(v[size_t(i)])), 5.3 * (s / 2) / std::sqrt(double(K)))
              << what << " i=" << i;
        }
      }
}

// Groups whose range exceeds FLT_MAX (values of both signs near 3e38, also
// among the non-spike values): x - zero overflowed, the scale became inf and
// the block decoded to inf/NaN. Now finite; within a step and unbiased except
// for the values the grid clips: above its top level (lowered by a bf16 ulp of
// the scale when it would round to inf) or below a zero held at the most
// negative finite bf16, by at most 2^-7 of L * scale.
TEST(BitsplitRounding, RangesBeyondFloatMaxStayFiniteWithinAStepAndUnbiased) {
  const int K = 2000;
  const int G = 32;
  const int64_t numel = 5 * G + 5;
  for (int bits : {2, 8})
    for (bool sr : {false, true}) {
      auto v = gaussian(numel, 23, 1e38f);
      for (auto& x : v) x = std::max(-3.3e38f, std::min(3.3e38f, x));
      for (int64_t e = 0; e < numel; e += G) {  // two of each extreme per group: spikes take one
        v[size_t(e)] = v[size_t(e) + 2] = 3.3e38f;
        v[size_t(e) + 1] = v[size_t(std::min<int64_t>(e + 3, numel - 1))] = -3.3e38f;
      }
      // beyond the largest finite bf16 (3.3895e38): the zero must stay finite
      v[size_t(2 * G + 4)] = -3.4e38f;
      v[size_t(2 * G + 5)] = 3.4e38f;
      // groups whose top level rounds to inf unless lowered (from a review)
      for (int64_t i = 3 * G; i < 4 * G; ++i) v[size_t(i)] = i % 2 ? -3.5657475e37f : 3.4006606e38f;
      for (int64_t i = 4 * G; i < 5 * G; ++i)
        v[size_t(i)] = i % 3 == 0 ? -3.1248e38f : i % 3 == 1 ? 3.4027758e38f : 3.385e38f;
      Bucket b = make_bucket(DType::kF32, v);
      BitsplitCodec c = codec_of(bits, G, sr, false);
      const std::string what = "bits=" + std::to_string(bits) + " sr=" + std::to_string(sr);
      auto parsed = parse_message(compress_all(c, b, rng_ctx(0, 0, 0, true)), (numel + G - 1) / G, bits,
                                  G, sr, false, DType::kF32);
      ASSERT_TRUE(std::isfinite(parsed[0].scale)) << what;
      ASSERT_GT(double(parsed[0].scale) * ((1 << bits) - 1), 3.4028234663852886e38) << what << ": not a range beyond FLT_MAX";
      // what the grid clips: outside [zero, top], top = fma(L, scale, zero)
      const double L = (1 << bits) - 1;
      std::vector<double> clip(size_t(numel), 0.0);
      for (int64_t i = 0; i < numel; ++i) {
        const auto& pg = parsed[size_t(i / G)];
        const double top = double(std::fmaf(float(L), pg.scale, pg.zero));
        ASSERT_TRUE(std::isfinite(top)) << what;
        if (sr && (i % G == pg.imin || i % G == pg.imax)) continue;  // spikes travel exactly
        clip[size_t(i)] = std::max({0.0, double(v[size_t(i)]) - top, double(pg.zero) - v[size_t(i)]});
        ASSERT_LE(clip[size_t(i)], std::ldexp(L * pg.scale, -7)) << what << " i=" << i;
      }
      std::vector<double> mean(size_t(numel), 0.0);
      for (int k = 0; k < K; ++k) {
        auto y = decompress_all(c, DType::kF32, numel, compress_all(c, b, rng_ctx(77, uint64_t(k), 1, true)));
        for (int64_t i = 0; i < numel; ++i) {
          const double s = parsed[size_t(i / G)].scale;
          ASSERT_TRUE(std::isfinite(y[size_t(i)])) << what << " i=" << i;
          ASSERT_LE(std::abs(double(y[size_t(i)]) - v[size_t(i)]), s * 1.0001 + clip[size_t(i)]) << what << " i=" << i;
          mean[size_t(i)] += y[size_t(i)];
        }
      }
      for (int64_t i = 0; i < numel; ++i) {
        const double s = parsed[size_t(i / G)].scale;
        EXPECT_LE(std::abs(mean[size_t(i)] / K - double(v[size_t(i)])),
                  5.3 * (s / 2) / std::sqrt(double(K)) + clip[size_t(i)])
            << what << " i=" << i;
      }
    }
}

TEST(BitsplitRounding, NearestIsDeterministicStochasticDependsOnKeyAndRank) {
  const int64_t numel = 5000;
  Bucket b = make_bucket(DType::kF32, gaussian(numel, 3));
  BitsplitCodec c = codec_of(3, 32, true, false);
  auto n1 = compress_all(c, b, rng_ctx(1, 1, 0, false));
  auto n2 = compress_all(c, b, rng_ctx(2, 9, 5, false));
  EXPECT_EQ(n1, n2);
  auto s1 = compress_all(c, b, rng_ctx(1, 1, 0, true));
  auto s1b = compress_all(c, b, rng_ctx(1, 1, 0, true));
  auto s2 = compress_all(c, b, rng_ctx(1, 2, 0, true));
  auto s3 = compress_all(c, b, rng_ctx(1, 1, 1, true));
  EXPECT_EQ(s1, s1b);
  EXPECT_NE(s1, s2);
  EXPECT_NE(s1, s3);
}

// ---- roles --------------------------------------------------------------------------------

// The fused role is compress(x + decompress(in)) exactly: same bytes as
// decompress_accumulate followed by compress of the accumulator, for bucket
// and accumulator inputs, for a block that does not start at unit 0.
TEST(BitsplitRoles, FusedEqualsAccumulateThenCompress) {
  for (DType dt : kDTypes)
    for (int bits : {2, 5, 7}) {
      BitsplitCodec c = codec_of(bits, bits >= 5 ? 128 : 32, bits <= 3, bits == 7);
      const int64_t numel = 7 * c.unit() + 300;
      Bucket mine = make_bucket(dt, gaussian(numel, 1));
      Bucket theirs = make_bucket(dt, gaussian(numel, 2));
      Plan plan = c.make_plan(dt, numel, 3);
      Block blk{plan.chunk_begin[1], plan.num_units};
      const RngCtx r1 = rng_ctx(7, 7, 1, true), r0 = rng_ctx(7, 7, 0, true);
      std::vector<uint8_t> in(c.static_bytes(plan, blk)), fused(in.size()), ref(in.size());
      Local lt;
      lt.bucket = theirs.data();
      c.compress(lt, plan, blk, r1, in.data());
      Local lm;
      lm.bucket = mine.data();
      c.decompress_accumulate_recompress(in.data(), in.size(), lm, plan, blk, r0, fused.data());
      std::vector<float> acc(static_cast<size_t>(blk.units() * plan.unit));
      c.decompress_accumulate(in.data(), in.size(), lm, plan, blk, acc.data());
      Local la;
      la.acc = acc.data();
      la.acc_w0 = blk.w0;
      c.compress(la, plan, blk, r0, ref.data());
      EXPECT_EQ(fused, ref) << dtype_name(dt) << " bits=" << bits;
      // decompress_accumulate with x aliasing acc: acc <- acc + decompress(in).
      std::vector<float> zeros(acc.size(), 0.0f), dec(acc.size());
      Local lz;
      lz.acc = zeros.data();
      lz.acc_w0 = blk.w0;
      c.decompress_accumulate(in.data(), in.size(), lz, plan, blk, dec.data());
      std::vector<float> acc2 = acc;
      Local la2;
      la2.acc = acc2.data();
      la2.acc_w0 = blk.w0;
      c.decompress_accumulate(in.data(), in.size(), la2, plan, blk, acc2.data());
      for (size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc2[i], acc[i] + dec[i]) << i;
    }
}

TEST(BitsplitRoles, DecompressAppliesTheDivisor) {
  const int64_t numel = 3000;
  auto v = gaussian(numel, 4);
  BitsplitCodec c = codec_of(6, 128, false, false);
  Bucket b = make_bucket(DType::kF32, v);
  auto msg = compress_all(c, b, rng_ctx(1, 1, 0, false));
  auto y1 = decompress_all(c, DType::kF32, numel, msg);
  Plan plan = c.make_plan(DType::kF32, numel, 1);
  std::vector<float> y3(static_cast<size_t>(numel));
  Output o;
  o.bucket = y3.data();
  o.divisor = 3.0f;
  c.decompress(msg.data(), msg.size(), plan, Block{0, plan.num_units}, o);
  for (int64_t i = 0; i < numel; ++i) ASSERT_EQ(y3[size_t(i)], y1[size_t(i)] / 3.0f);
}

// ---- the CUDA kernels' per-thread path, run on the host ----------------------------------

// The GPU kernels run bitsplit_encode_group / bitsplit_decode_group once per
// group (cuda/bitsplit_kernels.cu); the CPU codec runs the same pieces per
// unit. Running the per-group path on the host must give the codec's bytes
// and values, so the only GPU-specific code left is the loads and stores.
TEST(BitsplitGroupPath, PerGroupFunctionsEqualTheCodec) {
  for (int bits = 2; bits <= 8; ++bits)
    for (DType dt : kDTypes)
      for (bool stoch : {false, true}) {
        const bool sr = bits % 2 == 0, lg = bits >= 6;
        const int G = bits <= 4 ? 32 : 128;
        BitsplitCodec c = codec_of(bits, G, sr, lg);
        const int64_t numel = 3 * c.unit() + G + 9;
        Bucket b = make_bucket(dt, gaussian(numel, uint32_t(bits)));
        const auto x = b.values();
        const RngCtx r = rng_ctx(8, 9, 2, stoch);
        auto msg = compress_all(c, b, r);
        const BitsplitFormat f = c.format(dt);
        const int64_t ng = (numel + G - 1) / G;
        const BitsplitLayout lay = bitsplit_layout(f, ng);
        ASSERT_EQ(lay.total, int64_t(msg.size()));
        std::vector<uint8_t> mine(msg.size(), 0xcd);
        std::vector<float> v(static_cast<size_t>(G)), u(static_cast<size_t>(G));
        std::vector<uint8_t> codes(static_cast<size_t>(G));
        for (int64_t gi = 0; gi < ng; ++gi) {
          const int cnt = int(std::min<int64_t>(G, numel - gi * G));
          for (int i = 0; i < G; ++i) v[size_t(i)] = i < cnt ? x[size_t(gi * G + i)] : 0.0f;
          bitsplit_encode_group(v.data(), cnt, gi * G, gi, f, lay, stoch, r.key, uint32_t(r.rank),
                                u.data(), codes.data(), mine.data());
        }
        ASSERT_EQ(mine, msg) << "bits=" << bits << " " << dtype_name(dt) << " stochastic=" << stoch;
        auto y = decompress_all(c, dt, numel, msg);
        for (int64_t gi = 0; gi < ng; ++gi) {
          const int cnt = int(std::min<int64_t>(G, numel - gi * G));
          ASSERT_TRUE(bitsplit_decode_group(msg.data(), lay, f, gi, cnt, codes.data(), v.data()));
          for (int i = 0; i < cnt; ++i) {
            const float want = y[size_t(gi * G + i)];
            const float got = bitsplit_round_to_dtype(v[size_t(i)], dt);
            ASSERT_EQ(f32_bits(got), f32_bits(want)) << "group " << gi << " i " << i;
          }
          for (int i = cnt; i < G; ++i) ASSERT_EQ(v[size_t(i)], 0.0f);
        }
      }
}

// ---- degenerate groups ------------------------------------------------------------------

// Constant groups, all-zero groups, groups of 1, 2 and 3 elements, repeated
// minima and maxima, signed zeros. Zeros and bf16-representable constants
// come back exactly with bf16 scales (zero = the constant, scale = 0); with
// spikes the first min and first max come back exactly, and the code path
// never reads past the group.
TEST(BitsplitDegenerate, ConstantTinyAndTiedGroups) {
  const int G = 32;
  for (bool sr : {false, true})
    for (bool lg : {false, true})
      for (int64_t tail : {int64_t(1), int64_t(2), int64_t(3), int64_t(31)}) {
        std::vector<float> v;
        for (int i = 0; i < G; ++i) v.push_back(0.0f);                   // all zero
        for (int i = 0; i < G; ++i) v.push_back(0.75f);                  // constant, bf16-exact
        for (int i = 0; i < G; ++i) v.push_back(i % 2 ? -0.0f : 0.0f);  // signed zeros
        for (int i = 0; i < G; ++i) v.push_back(i % 3 == 0 ? 2.0f : (i % 3 == 1 ? -1.0f : 0.0f));  // ties
        for (int64_t i = 0; i < tail; ++i) v.push_back(float(i) - 0.25f);  // partial group
        const int64_t numel = int64_t(v.size());
        for (bool stoch : {false, true}) {
          BitsplitCodec c = codec_of(2, G, sr, lg);
          Bucket b = make_bucket(DType::kF32, v);
          auto msg = compress_all(c, b, rng_ctx(1, 1, 0, stoch));
          auto y = decompress_all(c, DType::kF32, numel, msg);
          const std::string what = std::string("sr=") + (sr ? "1" : "0") + " log=" + (lg ? "1" : "0") +
                                   " tail=" + std::to_string(tail);
          for (int i = 0; i < G; ++i) ASSERT_EQ(y[size_t(i)], 0.0f) << what;
          if (!lg) {
            for (int i = 0; i < 2 * G; ++i) ASSERT_EQ(y[size_t(G + i)], v[size_t(G + i)]) << what << " i=" << i;
          }
          // Tied group: values {2, -1, 0}; with INT2 and bf16 scales the grid
          // [-1, 2] has step 1 and holds every value exactly.
          if (!lg && !sr) {
            for (int i = 0; i < G; ++i) ASSERT_EQ(y[size_t(3 * G + i)], v[size_t(3 * G + i)]) << what;
          }
          if (sr) {
            auto parsed = parse_message(msg, (numel + G - 1) / G, 2, G, true, lg, DType::kF32);
            EXPECT_EQ(parsed[3].imin, 1) << "first -1 is at index 1";
            EXPECT_EQ(parsed[3].imax, 0) << "first 2 is at index 0";
            const auto& last = parsed.back();
            EXPECT_LT(last.imin, tail);
            EXPECT_LT(last.imax, tail);
            EXPECT_EQ(y[size_t(numel - tail)], v[size_t(numel - tail)]) << what;  // the min of the tail
            EXPECT_EQ(y[size_t(numel - 1)], v[size_t(numel - 1)]) << what;        // its max
          }
          // Every element within one step of its group's grid. bf16 scales:
          // step <= range/3 times the two bf16 roundings (2^-7 each). Log
          // scales: the zero lies in [-3 s, 63/64 * 3 s] in steps of 3 s/64,
          // so s >= max(range/(3*63/64), -lo/3, hi/(3*127/64)), rounded up by
          // at most 2^0.1.
          for (int64_t e = 0; e < numel; e += G) {
            const int64_t cnt = std::min<int64_t>(G, numel - e);
            const double lo = *std::min_element(v.begin() + e, v.begin() + e + cnt);
            const double hi = *std::max_element(v.begin() + e, v.begin() + e + cnt);
            const double step =
                lg ? std::max({(hi - lo) / 3 * 64 / 63, -lo / 3, hi / (3 * 127.0 / 64)}) * 1.08 + 1e-7
                   : (hi - lo) / 3 * 1.02 + 1e-7;
            for (int64_t i = e; i < e + cnt; ++i)
              ASSERT_LE(std::abs(y[size_t(i)] - v[size_t(i)]), step) << what << " i=" << i;
          }
        }
      }
}

// ---- untrusted input ---------------------------------------------------------------------

TEST(BitsplitMalformed, WrongSizeAndBadSpikeIndexRaise) {
  const int64_t numel = 1000;  // last group has 1000 - 31*32 = 8 elements
  BitsplitCodec c = codec_of(2, 32, true, false);
  Bucket b = make_bucket(DType::kF32, gaussian(numel, 6));
  auto msg = compress_all(c, b, rng_ctx(1, 1, 0, true));
  Plan plan = c.make_plan(DType::kF32, numel, 1);
  Block blk{0, plan.num_units};
  std::vector<float> y(static_cast<size_t>(numel));
  Output o;
  o.bucket = y.data();
  std::vector<uint8_t> shorter(msg.begin(), msg.end() - 1);
  EXPECT_THROW(c.decompress(shorter.data(), shorter.size(), plan, blk, o), MalformedMessage);
  std::vector<float> acc(static_cast<size_t>(plan.num_units * plan.unit));
  Local x;
  x.bucket = b.data();
  EXPECT_THROW(c.decompress_accumulate(msg.data(), msg.size() + 1, x, plan, blk, acc.data()),
               MalformedMessage);
  // The index section is the last 2*ng bytes: point group 31's argmax past its 8 elements.
  const size_t ng = 32;
  ASSERT_EQ(msg.size(), accounted_bytes(numel, 2, 32, true, false, DType::kF32));
  std::vector<uint8_t> bad = msg;
  bad.at(bad.size() - 1) = 8;
  EXPECT_THROW(c.decompress(bad.data(), bad.size(), plan, blk, o), MalformedMessage);
  bad = msg;
  bad.at(bad.size() - 2 * ng) = 200;  // group 0, argmin 200 >= 32
  std::vector<uint8_t> out(msg.size());
  EXPECT_THROW(c.decompress_accumulate_recompress(bad.data(), bad.size(), x, plan, blk,
                                                  rng_ctx(1, 1, 0, true), out.data()),
               MalformedMessage);
}

// Every role checks the message's size against the plan before it reads: a message one byte
// shorter or longer, or empty, is MalformedMessage, never decoded. The bytes are in a buffer
// that holds the whole message and one more, so a role that skipped the check would read only
// valid bytes and decode them (a shorter message read past its end, a longer one's extra byte
// ignored), and the test would see no exception.
TEST(BitsplitMalformed, EveryRoleRefusesAMessageOfAnotherSize) {
  const int64_t numel = 1000;
  for (bool spikes : {true, false}) {
    BitsplitCodec c = codec_of(4, 32, spikes, false);
    Bucket b = make_bucket(DType::kF32, gaussian(numel, 7));
    auto msg = compress_all(c, b, rng_ctx(1, 1, 0, true));
    Plan plan = c.make_plan(DType::kF32, numel, 1);
    Block blk{0, plan.num_units};
    std::vector<uint8_t> buf = msg;
    buf.push_back(0);
    std::vector<float> y(static_cast<size_t>(numel));
    Output o;
    o.bucket = y.data();
    std::vector<float> acc(static_cast<size_t>(plan.num_units * plan.unit));
    Local x;
    x.bucket = b.data();
    std::vector<uint8_t> out(buf.size());
    ASSERT_NO_THROW(c.decompress(buf.data(), msg.size(), plan, blk, o));
    for (size_t bad : {msg.size() - 1, msg.size() + 1, size_t(0)}) {
      SCOPED_TRACE("spikes=" + std::to_string(spikes) + " size " + std::to_string(bad) + " of " +
                   std::to_string(msg.size()));
      EXPECT_THROW(c.decompress(buf.data(), bad, plan, blk, o), MalformedMessage);
      EXPECT_THROW(c.decompress_accumulate(buf.data(), bad, x, plan, blk, acc.data()), MalformedMessage);
      EXPECT_THROW(c.decompress_accumulate_recompress(buf.data(), bad, x, plan, blk, rng_ctx(1, 1, 0, true),
                                                      out.data()),
                   MalformedMessage);
    }
  }
}

// Random bytes of the right size: every role either raises MalformedMessage
// (a spike index outside its group) or decodes something; none reads or
// writes outside its buffers (run under -DDYNAMIQ_ASAN=ON to check that).
TEST(BitsplitMalformed, RandomMessagesNeverCrash) {
  std::mt19937 g(17);
  for (int bits : {2, 3, 7, 8})
    for (bool sr : {false, true}) {
      BitsplitCodec c = codec_of(bits, bits <= 4 ? 32 : 128, sr, bits == 3);
      const int64_t numel = 2 * c.unit() + 77;
      Plan plan = c.make_plan(DType::kBF16, numel, 1);
      Block blk{0, plan.num_units};
      const size_t bytes = c.static_bytes(plan, blk);
      Bucket x = make_bucket(DType::kBF16, gaussian(numel, 1));
      Bucket y = make_bucket(DType::kBF16, std::vector<float>(static_cast<size_t>(numel), 0.0f));
      std::vector<float> acc(size_t(plan.num_units * plan.unit));
      std::vector<uint8_t> msg(bytes), out(bytes);
      int raised = 0;
      for (int it = 0; it < 50; ++it) {
        for (auto& b : msg) b = uint8_t(g());
        Local lx;
        lx.bucket = x.data();
        Output o;
        o.bucket = y.data();
        try {
          c.decompress(msg.data(), bytes, plan, blk, o);
          c.decompress_accumulate(msg.data(), bytes, lx, plan, blk, acc.data());
          c.decompress_accumulate_recompress(msg.data(), bytes, lx, plan, blk, rng_ctx(1, 1, 0, true), out.data());
        } catch (const MalformedMessage&) {
          ++raised;
        }
      }
      // A random index passes with probability G/256 and a message has dozens.
      if (sr) {
        EXPECT_EQ(raised, 50) << "random spike indices must be caught";
      } else {
        EXPECT_EQ(raised, 0);
      }
    }
}

TEST(BitsplitMalformed, ForeignPlansAreRefused) {
  BitsplitCodec c = codec_of(4, 32, false, false);
  Plan p = c.make_plan(DType::kF32, 5000, 2);
  Plan reordered = p;
  reordered.order.resize(size_t(p.num_units));
  EXPECT_THROW(c.static_bytes(reordered, Block{0, 1}), Error);
  Plan biased = p;
  biased.bias.assign(size_t(p.num_units), 0.0f);
  EXPECT_THROW(c.static_bytes(biased, Block{0, 1}), Error);
  Plan odd = p;
  odd.unit = 100;
  EXPECT_THROW(c.static_bytes(odd, Block{0, 1}), Error);
}

// Bitsplit's stochastic rounding over all 2^16 uniforms it can draw: P(round up)
// is the fractional part to within 2^-16 (the documented bound of 16-bit
// uniforms). The sampled test above tolerates 0.048 of a step per element; this
// one sees a uniform squeezed into [1/64, 1) (bias 0.016 of a step).
TEST(BitsplitRounding, StochasticUnbiasedByEnumerationOfTheUniforms) {
  std::mt19937 g(3);
  std::uniform_real_distribution<float> U(0.0f, 1.0f);
  double worst = 0;
  for (int k = 0; k < 200; ++k) {
    const float t = 3.0f + (k < 3 ? float(k) * 0.25f + 0.125f : U(g));
    const double f = double(t) - 3.0;
    uint64_t ups = 0;
    for (uint32_t h = 0; h < 65536u; ++h) ups += bitsplit_quant_stochastic(t, 0.0f, 1.0f, 15.0f, bitsplit_u16(h)) - 3u;
    worst = std::max(worst, std::fabs(double(ups) / 65536.0 - f));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -16) * (1 + 1e-9));
}

}  // namespace
}  // namespace dynamiq
