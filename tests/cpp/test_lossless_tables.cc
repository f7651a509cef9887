// Tables, counts and streams the lossless decoder must refuse (mutations #16-#18 of
// scripts/mutate/mutants.txt survived the suite: its messages were caught later, for other
// reasons, or not at all).
//
// Huffman: three symbols of length 1 are over-subscribed (Kraft sum 3/2); the canonical table
// then maps even peeks to the third symbol and odd ones to the second, so a stream of zero bits
// decodes cleanly: a message no encoder writes, refused only by the Kraft check. The same
// message with lengths {1, 2, 2} (a complete code) decodes, so it is otherwise well formed.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace dynamiq
