// Philox4x32-10: the Random123 known-answer vectors (Salmon et al., SC11; Random123 kat_vectors) and determinism.
#include <gtest/gtest.h>

#include <set>

#include "kernels/base/philox.h"

namespace dynamiq {
namespace {

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t out[4];
};

TEST(Philox, Random123KnownAnswers) {
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Philox4x32 r = philox4x32_10(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << "word " << i;
  }
}

TEST(Philox, SameInputsSameOutputsAndCountersDiffer) {
  const RngKey key = make_rng_key(1234, 56);
  std::set<uint32_t> seen;
  for (uint32_t c = 0; c < 1000; ++c) {
    const Philox4x32 a = philox4x32_10(c, 1, 2, 0, key.k0, key.k1);
    const Philox4x32 b = philox4x32_10(c, 1, 2, 0, key.k0, key.k1);
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(a.v[i], b.v[i]);
      seen.insert(a.v[i]);
    }
  }
  // 4000 words from distinct counters: a collision of 32-bit words has
  // probability ~ 4000^2 / 2^33 < 0.2%; require at most one.
  EXPECT_GE(seen.size(), 3999u);
  // Keys from neighbouring (seed, sequence) pairs are unrelated.
  const RngKey k2 = make_rng_key(1234, 57), k3 = make_rng_key(1235, 56);
  EXPECT_NE(key.k0, k2.k0);
  EXPECT_NE(key.k0, k3.k0);
  EXPECT_EQ(make_rng_key(1234, 56).k0, key.k0);
  EXPECT_EQ(make_rng_key(1234, 56).k1, key.k1);
}

TEST(Philox, U01IsInUnitIntervalAndUsesTop24Bits) {
  EXPECT_EQ(u01(0u), 0.0f);
  EXPECT_EQ(u01(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_EQ(u01(0x00000100u), 1.0f / 16777216.0f);
  EXPECT_EQ(u01(0x000000ffu), 0.0f);
  EXPECT_EQ(u01(0x80000000u), 0.5f);
}

}  // namespace
}  // namespace dynamiq
