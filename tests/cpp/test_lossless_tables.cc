// Tables, counts and streams the lossless decoder must refuse (mutations #16-#18 of
// scripts/mutate/mutants.txt survived the suite: its messages were caught later, for other
// reasons, or not at all).
//
// Huffman: three symbols of length 1 are over-subscribed (Kraft sum 3/2); the canonical table
// then maps even peeks to the third symbol and odd ones to the second, so a stream of zero bits
// decodes cleanly: a message no encoder writes, refused only by the Kraft check. The same
// message with lengths {1, 2, 2} (a complete code) decodes, so it is otherwise well formed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {
namespace {

// A bf16 block of 1024 values (one segment): header, 1024 SM bytes, then a Huffman section of 3
// symbols with the given 4-bit lengths and one segment of 128 zero bytes (1024 one-bit codes).
// `stream_bytes` > 128: the segment's stream carries that many bytes (zeros) after its codes.
std::vector<uint8_t> huffman_message(uint8_t len0, uint8_t len1, uint8_t len2, uint16_t stream_bytes = 128) {
  const DType t = DType::kBF16;
  const int64_t n = 1024;
  const size_t sb = lossless_static_bytes(t, n);
  std::vector<uint8_t> sec = {2 /* k - 1 */, 100, 101, 102, uint8_t(len0 | (len1 << 4)), uint8_t(len2),
                              uint8_t(stream_bytes), uint8_t(stream_bytes >> 8)};
  sec.resize(sec.size() + stream_bytes, 0);
  std::vector<uint8_t> msg(sb, 0x25);  // any sign and mantissa bits
  lossless_write_header(msg.data(), t, n, lossless::ExpFormat::kHuffman, uint32_t(sec.size()));
  msg.insert(msg.end(), sec.begin(), sec.end());
  return msg;
}

TEST(LosslessTables, CompleteCodeDecodes) {
  const auto msg = huffman_message(1, 2, 2);
  std::vector<uint16_t> out(1024);
  ASSERT_NO_THROW(lossless_decode(msg.data(), msg.size(), DType::kBF16, 1024, out.data()));
  for (uint16_t v : out) EXPECT_EQ((v >> 7) & 0xff, 100) << "exponent of the one-bit code 0";
}

TEST(LosslessTables, OverSubscribedCodeIsMalformedEvenWhenItsStreamDecodes) {
  const auto msg = huffman_message(1, 1, 1);
  std::vector<uint16_t> out(1024);
  EXPECT_THROW(lossless_decode(msg.data(), msg.size(), DType::kBF16, 1024, out.data()), MalformedMessage);
  LosslessDecodePlan p;
  EXPECT_THROW(lossless_parse(msg.data(), msg.size(), DType::kBF16, 1024, p), MalformedMessage);
}

// A segment's stream must end with its last code (lossless_format.h: valid iff the stream's
// bytes are exactly consumed): one byte more is refused, though every code decodes. Mutation
// #18 (trailing bytes accepted) survived without this.
TEST(LosslessTables, SegmentStreamWithATrailingByteIsMalformed) {
  const auto msg = huffman_message(1, 2, 2, 129);
  std::vector<uint16_t> out(1024);
  EXPECT_THROW(lossless_decode(msg.data(), msg.size(), DType::kBF16, 1024, out.data()), MalformedMessage);
}

// A ZipCCL segment announcing more escapes than it has values is refused by lossless_parse,
// which validates every count it can without decoding (the CUDA path runs the kernels only
// after it). The escape list is lengthened to match, so the totals still agree. Mutation #16
// (the bound loosened by one) survived because the CPU decoder then fails the segment anyway.
TEST(LosslessTables, SegmentEscapeCountAboveItsSizeIsRefusedByTheParser) {
  const DType t = DType::kBF16;
  // three segments of 1024: one segment's 1025 escapes plus the others' still fit the plain
  // bound (8G = 3072 bytes), so only the per-segment check can refuse the count
  const int64_t n = 3072;
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = uint16_t((uint32_t(120 + i % 9) << 7) | (i & 0x7f));
  std::vector<uint8_t> msg(lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n));
  LosslessOptions opt;
  opt.formats = (1u << 0) | (1u << 2);  // plain or zip
  LosslessBlockInfo info;
  msg.resize(lossless_encode(v.data(), t, n, msg.data(), opt, &info));
  ASSERT_EQ(info.format, lossless::ExpFormat::kZip);
  const size_t sb = lossless_static_bytes(t, n);
  uint16_t c0;
  std::memcpy(&c0, msg.data() + sb + 8, 2);
  const uint16_t c1 = uint16_t(lossless::kSegment + 1);  // one more than the segment's values
  std::memcpy(msg.data() + sb + 8, &c1, 2);
  msg.resize(msg.size() + (c1 - c0), 120);  // escape list as long as the counts say
  lossless_write_header(msg.data(), t, n, lossless::ExpFormat::kZip, uint32_t(msg.size() - sb));
  ASSERT_LE(msg.size() - sb, lossless_max_dynamic_bytes(t, n)) << "within the bound: not refused for its size";
  LosslessDecodePlan p;
  try {
    lossless_parse(msg.data(), msg.size(), t, n, p);
    ADD_FAILURE() << "accepted";
  } catch (const MalformedMessage& e) {
    EXPECT_NE(std::string(e.what()).find("escape count out of range"), std::string::npos) << e.what();
  }
  std::vector<uint16_t> out(v.size());
  EXPECT_THROW(lossless_decode(msg.data(), msg.size(), t, n, out.data()), MalformedMessage);
}

// lossless_parse_parts (the CUDA decode's parse) reads only the header and the first
// min(dynamic_bytes, lossless_parse_prefix_bytes) section bytes: given exactly those, in
// buffers of exactly that size (ASan catches a read past them), it makes lossless_parse's plan
// for every format; given one byte fewer it refuses with an Error that is not MalformedMessage
// (a caller's bug, not a bad message).
TEST(LosslessTables, ParsePartsReadsOnlyTheHeaderAndTheSectionPrefix) {
  const DType t = DType::kBF16;
  const int64_t n = 40000 + 3;
  std::vector<std::vector<uint8_t>> msgs;
  for (uint32_t formats : {0x1u, 0x3u, 0x5u, 0x9u}) {
    std::vector<uint16_t> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      // exponent 118 + a geometric count (skewed: zip and Huffman pay), random low mantissa bits
      const uint32_t r = uint32_t(uint64_t(i + 1) * 2654435761u) ^ uint32_t(i >> 3);
      const uint32_t e = 118 + uint32_t(__builtin_ctz(r | 0x100u));
      x[size_t(i)] = formats == 0x3u ? uint16_t(0x3fc0) : uint16_t((e << 7) | ((r >> 25) & 0x7fu));
    }
    LosslessOptions opt;
    opt.formats = formats;
    std::vector<uint8_t> m(lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n));
    m.resize(lossless_encode(x.data(), t, n, m.data(), opt));
    msgs.push_back(m);
  }
  ASSERT_EQ(lossless::ExpFormat(msgs[0][3]), lossless::ExpFormat::kPlain);
  ASSERT_EQ(lossless::ExpFormat(msgs[1][3]), lossless::ExpFormat::kConst);
  ASSERT_EQ(lossless::ExpFormat(msgs[2][3]), lossless::ExpFormat::kZip);
  ASSERT_EQ(lossless::ExpFormat(msgs[3][3]), lossless::ExpFormat::kHuffman);
  const size_t st = lossless_static_bytes(t, n), prefix = lossless_parse_prefix_bytes(t, n);
  EXPECT_EQ(prefix, size_t(385 + 2 * 40));
  for (const auto& m : msgs) {
    SCOPED_TRACE(lossless::exp_format_name(lossless::ExpFormat(m[3])));
    LosslessDecodePlan want, got;
    lossless_parse(m.data(), m.size(), t, n, want);
    const std::vector<uint8_t> header(m.begin(), m.begin() + 16);
    const size_t need = std::min(m.size() - st, prefix);
    const std::vector<uint8_t> sec(m.begin() + long(st), m.begin() + long(st + need));
    lossless_parse_parts(header.data(), sec.data(), sec.size(), m.size(), t, n, got);
    EXPECT_EQ(got.format, want.format);
    EXPECT_EQ(got.dynamic_bytes, want.dynamic_bytes);
    EXPECT_EQ(got.constant, want.constant);
    EXPECT_EQ(std::memcmp(got.zip_table, want.zip_table, 8), 0);
    EXPECT_EQ(got.planes_offset, want.planes_offset);
    EXPECT_EQ(got.payload_offset, want.payload_offset);
    EXPECT_EQ(got.payload_bytes, want.payload_bytes);
    EXPECT_EQ(got.seg_start, want.seg_start);
    EXPECT_EQ(got.huff_table, want.huff_table);
    if (need == 0) continue;
    bool threw_error = false, threw_malformed = false;
    try {
      lossless_parse_parts(header.data(), sec.data(), need - 1, m.size(), t, n, got);
    } catch (const MalformedMessage&) {
      threw_malformed = true;
    } catch (const Error&) {
      threw_error = true;
    }
    EXPECT_TRUE(threw_error);
    EXPECT_FALSE(threw_malformed);
  }
}

}  // namespace
}  // namespace dynamiq
