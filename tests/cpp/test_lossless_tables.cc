// Huffman tables the lossless parser must refuse even when a stream decodes under them
// (issue 35 mutation campaign: #17, the over-subscription check removed, survived; the
// existing corrupted-table test was still caught later, by the stream check). Three symbols of
// length 1 are over-subscribed (Kraft sum 3/2): the canonical table then maps even peeks to the
// third symbol and odd ones to the second, so a stream of zero bits decodes cleanly, a message
// that no encoder writes. The parser must raise MalformedMessage before any stream is read.
// The same message with lengths {1, 2, 2} (a complete code) decodes, which shows that the
// hand-made message is otherwise well formed.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {
namespace {

// A bf16 block of 1024 values (one segment): header, 1024 SM bytes, then a Huffman section of 3
// symbols with the given 4-bit lengths and one segment of 128 zero bytes (1024 one-bit codes).
std::vector<uint8_t> huffman_message(uint8_t len0, uint8_t len1, uint8_t len2) {
  const DType t = DType::kBF16;
  const int64_t n = 1024;
  const size_t sb = lossless_static_bytes(t, n);
  std::vector<uint8_t> sec = {2 /* k - 1 */, 100, 101, 102, uint8_t(len0 | (len1 << 4)), uint8_t(len2), 128, 0};
  sec.resize(sec.size() + 128, 0);
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

}  // namespace
}  // namespace dynamiq
