// A ZipCCL segment whose escape count disagrees with its codes (issue 35, item 5: a mutation
// that dropped the decoder's `pos != end` check survived the suite). The header, its CRC and
// every table still parse after one flipped code-plane bit, and the counts still add up to the
// escape list, so only the per-segment check in the decoder can see it:
//  - an escape's code turned into a real code: the segment announces one escape more than its
//    codes use. Without the check the message decodes, silently, to the wrong exponent (the
//    code's table entry instead of the escaped one) and the segments after it read the escapes
//    of their predecessors;
//  - a real code turned into the escape code: the segment needs one escape more than announced.
// Both must raise MalformedMessage, on the CPU decoder and through the codec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {
namespace {

using lossless::ExpFormat;

// n bf16 values with exponents on 9 neighbouring values (uniform in [1, 500)) and every 97th
// one far outside (1e-30): 10 exponents for ZipCCL's 7 codes, so a section with escapes (the
// outliers and the rarest exponents) in every segment.
std::vector<uint16_t> zip_values(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(1.0f, 500.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = f32_to_bf16(i % 97 == 5 ? 1e-30f : u(g));
  return v;
}

struct ZipMessage {
  std::vector<uint8_t> msg;
  LosslessDecodePlan plan;
  size_t section = 0;  // offset of the exponent section in msg
};

ZipMessage encode_zip(const std::vector<uint16_t>& v) {
  const int64_t n = int64_t(v.size());
  ZipMessage z;
  z.msg.resize(lossless_static_bytes(DType::kBF16, n) + lossless_max_dynamic_bytes(DType::kBF16, n));
  LosslessOptions opt;
  opt.formats = (1u << 0) | (1u << 2);  // plain or zip
  LosslessBlockInfo info;
  z.msg.resize(lossless_encode(v.data(), DType::kBF16, n, z.msg.data(), opt, &info));
  EXPECT_EQ(info.format, ExpFormat::kZip);
  lossless_parse(z.msg.data(), z.msg.size(), DType::kBF16, n, z.plan);
  z.section = lossless_static_bytes(DType::kBF16, n);
  return z;
}

// Code (0..7) of body value i and the byte/bit of its plane-0 bit.
int code_of(const ZipMessage& z, int64_t i) {
  const int64_t G = z.plan.layout.groups;
  const uint8_t* planes = z.msg.data() + z.section + z.plan.planes_offset;
  int c = 0;
  for (int k = 0; k < 3; ++k) c |= ((planes[k * G + i / 8] >> (i % 8)) & 1) << k;
  return c;
}
void flip_plane0(ZipMessage& z, int64_t i) {
  z.msg[z.section + size_t(z.plan.planes_offset) + size_t(i / 8)] ^= uint8_t(1u << (i % 8));
}

void expect_rejected(const std::vector<uint8_t>& msg, int64_t n, const std::string& what) {
  SCOPED_TRACE(what);
  // Every check before the decoder passes: header, CRC, tables, counts against the list.
  LosslessDecodePlan p;
  ASSERT_NO_THROW(lossless_parse(msg.data(), msg.size(), DType::kBF16, n, p));
  std::vector<uint16_t> out(static_cast<size_t>(n));
  EXPECT_THROW(lossless_decode(msg.data(), msg.size(), DType::kBF16, n, out.data()), MalformedMessage);
  // and through the codec, as a received block
  LosslessCodec codec;
  const Plan plan = make_lossless_plan(DType::kBF16, n, 1);
  const Block b{0, plan.num_units};
  Output y;
  y.bucket = out.data();
  EXPECT_THROW(codec.decompress(msg.data(), msg.size(), plan, b, y), MalformedMessage);
}

// The first body value of segment s (1024 exponents each) whose code is c, or -1.
int64_t find_code(const ZipMessage& z, int64_t s, int c) {
  const int64_t end = std::min<int64_t>(z.plan.layout.body, (s + 1) * lossless::kSegment);
  for (int64_t i = s * lossless::kSegment; i < end; ++i)
    if (code_of(z, i) == c) return i;
  return -1;
}

TEST(LosslessEscapes, SegmentAnnouncingMoreEscapesThanItsCodesUseIsMalformed) {
  for (int64_t n : {int64_t(1000), int64_t(3000)})  // one segment; three
    for (int64_t seg = 0; seg * lossless::kSegment < (n / 8) * 8; ++seg) {
      const auto v = zip_values(n, uint32_t(n + seg));
      ZipMessage z = encode_zip(v);
      ASSERT_EQ(z.plan.format, ExpFormat::kZip);
      {  // the unflipped message decodes to the input
        std::vector<uint16_t> out(v.size());
        lossless_decode(z.msg.data(), z.msg.size(), DType::kBF16, n, out.data());
        ASSERT_EQ(out, v);
      }
      const int64_t esc = find_code(z, seg, 0);
      ASSERT_GE(esc, 0) << "segment " << seg << " has no escape";
      ZipMessage fewer = z;
      flip_plane0(fewer, esc);  // escape -> code 1: one escape announced but unused
      ASSERT_EQ(code_of(fewer, esc), 1);
      expect_rejected(fewer.msg, n, "n " + std::to_string(n) + " segment " + std::to_string(seg) + ": escape -> code 1");
    }
}

TEST(LosslessEscapes, SegmentUsingMoreEscapesThanAnnouncedIsMalformed) {
  for (int64_t n : {int64_t(1000), int64_t(3000)})
    for (int64_t seg = 0; seg * lossless::kSegment < (n / 8) * 8; ++seg) {
      const auto v = zip_values(n, uint32_t(7 * n + seg));
      ZipMessage z = encode_zip(v);
      const int64_t target = find_code(z, seg, 1);  // code 1 -> escape (0) by one plane-0 bit
      ASSERT_GE(target, 0) << "segment " << seg << " has no value coded 1";
      ZipMessage more = z;
      flip_plane0(more, target);
      ASSERT_EQ(code_of(more, target), 0);
      expect_rejected(more.msg, n, "n " + std::to_string(n) + " segment " + std::to_string(seg) + ": code 1 -> escape");
    }
}

}  // namespace
}  // namespace dynamiq
