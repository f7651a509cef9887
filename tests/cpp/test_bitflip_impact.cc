// What one flipped bit in a received message does to the decoded values, per region of the
// message (docs/reliability.md, "Corruption that decodes"): every bit of a block is flipped in
// turn, the block decoded, and the change compared with the unflipped decode. The wire formats
// give every bit pattern a meaning (DynamiQ, bitsplit, raw values), so these flips are not
// detectable by the decoder; what bounds them is how far one bit reaches:
//  - DynamiQ code bit: one element, by at most 2x its group's scale (levels lie in [-1, 1]);
//  - DynamiQ group scale (uint8): the 16 elements of that group, each by at most its own
//    decoded magnitude times 255 (r/255 of the SG scale, r in 0..255);
//  - DynamiQ SG scale (bf16): the SG's elements, without bound (an exponent bit multiplies
//    them by up to 2^128: inf or NaN included);
//  - bitsplit code bit: one element, by at most 2^(plane shift + plane width) steps of its
//    group's scale; scale/zero: its group; spike value or index: its group;
//  - raw float32 (mode none; lossless mantissas): one element; an exponent bit by up to 2^128.
// The tests assert the confinement and the bounds, and print the counts per region.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/identity/identity_codec.h"

namespace dynamiq {
namespace {

std::vector<float> values(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = d(g) * std::ldexp(1.0f, int(i / 256) % 5 - 2);
  return x;
}

struct Region {
  const char* name;
  int flips = 0, changed = 0, nonfinite = 0;
  double worst_rel = 0.0;  // max |change| / max |unflipped| over the bucket
};

// One SG per width in {2, 4, 8}, hierarchical scales (S 256, s 16): flip every bit.
TEST(BitFlipImpact, DynamiqFlipsStayInsideTheirRegionAndCodeFlipsAreBounded) {
  const DynamiqFormat fmt;  // S 256, s 16, hierarchical
  DynamiqCodec codec;
  for (int width : {2, 4, 8}) {
    const int64_t numel = 256;
    const Plan plan = make_dynamiq_plan(DType::kF32, numel, fmt, {uint8_t(width)}, {}, {}, 1);
    const Block b{0, 1};
    const std::vector<float> x = values(numel, uint32_t(width));
    std::vector<uint8_t> msg(codec.static_bytes(plan, b));
    Local l;
    l.bucket = x.data();
    RngCtx rng;
    rng.key = make_rng_key(1, 1);
    ASSERT_EQ(codec.compress(l, plan, b, rng, msg.data()), msg.size());
    std::vector<float> ref(numel), y(numel);
    Output o;
    o.bucket = ref.data();
    codec.decompress(msg.data(), msg.size(), plan, b, o);
    double refmax = 0;
    for (float v : ref) refmax = std::max(refmax, double(std::fabs(v)));
    const float sg_scale = bf16_to_f32(uint16_t(msg[0] | (msg[1] << 8)));
    const int G = fmt.S / fmt.s;
    Region regions[3] = {{"SG scale"}, {"group scales"}, {"codes"}};
    const int64_t nb = int64_t(fmt.S) * width / 8;  // code bytes
    for (size_t bit = 0; bit < 8 * msg.size(); ++bit) {
      std::vector<uint8_t> m = msg;
      m[bit / 8] ^= uint8_t(1u << (bit % 8));
      o.bucket = y.data();
      codec.decompress(m.data(), m.size(), plan, b, o);  // never raises: every pattern is valid
      const size_t byte = bit / 8;
      const int reg = byte < 2 ? 0 : byte < size_t(2 + G) ? 1 : 2;
      Region& R = regions[reg];
      ++R.flips;
      int changed = 0;
      for (int64_t i = 0; i < numel; ++i) {
        if (std::memcmp(&y[size_t(i)], &ref[size_t(i)], 4) == 0) continue;
        ++changed;
        if (!std::isfinite(y[size_t(i)])) {
          ++R.nonfinite;
          R.worst_rel = INFINITY;
          continue;
        }
        const double d = std::fabs(double(y[size_t(i)]) - double(ref[size_t(i)]));
        R.worst_rel = std::max(R.worst_rel, d / refmax);
        const int group = int(i / fmt.s);
        if (reg == 1) {
          // only the flipped group's elements
          EXPECT_EQ(group, int(byte) - 2) << "width " << width << " bit " << bit << " element " << i;
        }
        if (reg == 2) {
          // the code bytes are planar: byte k holds elements k, k + nb, ...; one element changes
          const int64_t k = int64_t(byte) - 2 - G;
          const int64_t e = k + nb * int64_t((bit % 8) / size_t(width));
          EXPECT_EQ(i, e) << "width " << width << " code bit " << bit;
          const float gs = float(msg[size_t(2 + group)]) / 255.0f * sg_scale;
          EXPECT_LE(d, 2.0 * double(gs) * (1.0 + 1e-6)) << "width " << width << " code bit " << bit;
        }
      }
      if (changed) ++R.changed;
      if (reg == 2) {
        EXPECT_LE(changed, 1) << "width " << width << " code bit " << bit;
      }
    }
    for (const Region& R : regions)
      std::printf("[ dynamiq width %d ] %-12s %4d bits: %4d change the output, %3d to inf/NaN; worst change "
                  "%.3g of the bucket's largest value\n",
                  width, R.name, R.flips, R.changed, R.nonfinite, R.worst_rel);
  }
}

// Raw float32 values (mode none's wire, and a lossless message's mantissa and sign bits): one
// element per bit, by any factor for an exponent bit.
TEST(BitFlipImpact, RawFloatFlipsChangeOneElement) {
  IdentityCodec codec;
  const int64_t numel = 64;
  const Plan plan = make_identity_plan(DType::kF32, numel, 1);
  const Block b{0, 1};
  const std::vector<float> x = values(numel, 3);
  std::vector<uint8_t> msg(numel * 4);
  std::memcpy(msg.data(), x.data(), msg.size());
  double worst_exp = 0, worst_mant = 0;
  int nonfinite = 0;
  for (size_t bit = 0; bit < 8 * msg.size(); ++bit) {
    std::vector<uint8_t> m = msg;
    m[bit / 8] ^= uint8_t(1u << (bit % 8));
    std::vector<float> y(numel);
    Output o;
    o.bucket = y.data();
    codec.decompress(m.data(), m.size(), plan, b, o);
    int changed = 0;
    for (int64_t i = 0; i < numel; ++i)
      if (std::memcmp(&y[size_t(i)], &x[size_t(i)], 4) != 0) {
        ++changed;
        EXPECT_EQ(i, int64_t(bit / 32));
        const double r = std::fabs(double(y[size_t(i)]) / double(x[size_t(i)]));
        const int field = int(bit % 32);
        if (!std::isfinite(y[size_t(i)])) ++nonfinite;
        else if (field >= 23 && field < 31) worst_exp = std::max(worst_exp, std::max(r, 1.0 / r));
        else if (field < 23) worst_mant = std::max(worst_mant, std::max(r, 1.0 / r));
      }
    EXPECT_EQ(changed, 1) << bit;
  }
  std::printf("[ float32 ] %zu bits: each changes one element; mantissa bits by up to x%.3g, exponent bits by "
              "up to x%.3g, %d to inf/NaN\n",
              8 * msg.size(), worst_mant, worst_exp, nonfinite);
  EXPECT_GT(worst_exp, 1e30);  // unbounded in practice: no checksum, no plausibility check
}

// Bitsplit (4 bits, groups of 32, bf16 scales, no spikes): a code bit changes one element.
TEST(BitFlipImpact, BitsplitCodeFlipsChangeOneElement) {
  BitsplitParams p;
  p.bits = 4;
  p.group = 32;
  BitsplitCodec codec(p);
  const int64_t numel = 1024;
  const Plan plan = codec.make_plan(DType::kF32, numel, 1);
  const Block b{0, plan.num_units};
  const std::vector<float> x = values(numel, 5);
  std::vector<uint8_t> msg(codec.static_bytes(plan, b));
  Local l;
  l.bucket = x.data();
  RngCtx rng;
  rng.key = make_rng_key(2, 1);
  codec.compress(l, plan, b, rng, msg.data());
  std::vector<float> ref(numel);
  Output o;
  o.bucket = ref.data();
  codec.decompress(msg.data(), msg.size(), plan, b, o);
  const size_t code_bytes = size_t(numel) * 4 / 8;  // plane 0 of 4 bits: the codes come first
  int meta_changed = 0, meta_flips = 0;
  for (size_t bit = 0; bit < 8 * msg.size(); ++bit) {
    std::vector<uint8_t> m = msg;
    m[bit / 8] ^= uint8_t(1u << (bit % 8));
    std::vector<float> y(numel);
    o.bucket = y.data();
    codec.decompress(m.data(), m.size(), plan, b, o);
    std::vector<int64_t> diff;
    for (int64_t i = 0; i < numel; ++i)
      if (std::memcmp(&y[size_t(i)], &ref[size_t(i)], 4) != 0) diff.push_back(i);
    if (bit / 8 < code_bytes) {
      EXPECT_LE(diff.size(), 1u) << "code bit " << bit;
      if (!diff.empty()) {
        EXPECT_EQ(diff[0], int64_t(bit / 4)) << "code bit " << bit;
      }
    } else {
      ++meta_flips;
      meta_changed += !diff.empty();
      if (!diff.empty()) {
        EXPECT_EQ(diff.front() / 32, diff.back() / 32) << "scale bit " << bit << ": one group only";
      }
    }
  }
  std::printf("[ bitsplit 4-bit ] code bits change one element each; %d of %d scale/zero bits change their group\n",
              meta_changed, meta_flips);
}

}  // namespace
}  // namespace dynamiq
