// libFuzzer target: the lossless block parser and exponent decoders (plain, const, ZipCCL
// codes with escapes, canonical Huffman with its tables and multi-symbol fast path) through
// the block API: lossless_dynamic_bytes on the static part, then lossless_decode on the
// whole message.
//
// Input: an 8-byte prefix, then the message.
//   p[0] dtype (mod 3)
//   p[1] bit 0: rewrite the header's CRC-16 after the other fix-ups, so that mutated header
//        fields reach the checks behind the checksum; bit 1: write the expected dtype and
//        count into the header (the plan's, as a receiver knows them); bit 2: cut or
//        zero-pad the message to static + announced dynamic bytes (capped at the bound)
//   p[2..3] n = u16 % 20000 values (up to 20 segments of 1024 exponents, so that the
//        4-lane and multi-symbol Huffman paths run)
//
// Properties: every call ends in MalformedMessage or returns; dynamic_bytes <= the plain
// bound; a message that decodes re-encodes (lossless_encode) to a message that decodes to
// the same bits (the decoder accepts nothing the encoder cannot reproduce the values of),
// at most raw + 16 bytes.
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "kernels/lossless/lossless_codec.h"

using namespace dqfuzz;
using namespace dynamiq::lossless;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input<8> in(data, size);
  const DType t = DType(in.p[0] % 3);
  const int64_t n = in.u16(2) % 20000;
  const size_t es = size_t(dtype_size(t));
  const size_t sb = lossless_static_bytes(t, n);
  const size_t maxd = lossless_max_dynamic_bytes(t, n);

  std::vector<uint8_t> raw(in.rest, in.rest + in.rest_bytes);
  if ((in.p[1] & 2) && raw.size() >= size_t(kHeaderBytes)) {
    raw[2] = uint8_t(t);
    const uint32_t cnt = uint32_t(n);
    std::memcpy(raw.data() + 4, &cnt, 4);
  }
  if (in.p[1] & 4) {
    uint32_t d = uint32_t(maxd);
    if (raw.size() >= 12) std::memcpy(&d, raw.data() + 8, 4);
    raw.resize(sb + std::min<size_t>(d, maxd), 0);
  }
  if ((in.p[1] & 1) && raw.size() >= size_t(kHeaderBytes)) {
    const uint16_t crc = crc16(raw.data(), kHeaderBytes - 2);
    std::memcpy(raw.data() + kHeaderBytes - 2, &crc, 2);
  }
  ExactBuffer msg(raw.data(), raw.size());
  ExactBuffer values(size_t(n) * es);
  bool decoded = false;
  try {
    if (msg.size() >= sb) {
      ExactBuffer static_part(msg.data(), sb);
      const size_t d = lossless_dynamic_bytes(static_part.data(), t, n);
      FUZZ_CHECK(d <= maxd, "dynamic_bytes " + std::to_string(d) + " > bound " + std::to_string(maxd));
    }
    lossless_decode(msg.data(), msg.size(), t, n, values.data());
    decoded = true;
  } catch (const MalformedMessage&) {
  } catch (const std::exception& e) {
    fail(std::string("lossless: a received message raised something other than MalformedMessage: ") + e.what());
  }
  if (!decoded) return 0;
  // Round trip of what was accepted.
  ExactBuffer re(sb + maxd);
  const size_t m = lossless_encode(values.data(), t, n, re.data());
  FUZZ_CHECK(m <= sb + maxd, "re-encoded message of " + std::to_string(m) + " bytes");
  FUZZ_CHECK(m <= size_t(n) * es + kHeaderBytes, "re-encoded message larger than raw + 16");
  ExactBuffer again(size_t(n) * es);
  try {
    lossless_decode(re.data(), m, t, n, again.data());
  } catch (const std::exception& e) {
    fail(std::string("lossless: the encoder's own message does not decode: ") + e.what());
  }
  FUZZ_CHECK(std::memcmp(values.data(), again.data(), values.size()) == 0,
             "decode(encode(decode(msg))) differs from decode(msg)");
  return 0;
}
