// The checks a received lossless message passes before anything reads its
// payload, as __host__ __device__ functions: the host parse (lossless_parse
// in lossless_codec.cc) and the device parse (parse_kernel in
// cuda/lossless_decode_kernels.cu) call the same ones, so both refuse the same
// messages. A check returns a Fault -- what failed and the numbers its
// message quotes -- and lossless_fault_message (lossless_codec.h) words it.
//
// Order: the size of the static part, the header (check_header), the
// message's size against the header's, the section's tables (check_tables),
// then the per-segment counts and their total (zip_count_ok,
// check_segment_total). Tables are read only below min(dynamic_bytes, the
// largest table) -- what lossless_parse_prefix_bytes bounds.
#pragma once

#include <cstring>

#include "kernels/lossless/lossless_format.h"

namespace dynamiq {
namespace lossless {

enum class FaultKind : int32_t {
  kNone = 0,
  kTruncated,            // a: message bytes, b: static bytes
  kMagic,                // a: the magic byte
  kVersion,              // a: the version byte
  kChecksum,
  kDtype,                // a: the dtype byte
  kCount,                // a: the header's count, b: n
  kReserved,
  kFormat,               // a: the format byte
  kDynamicBound,         // a: dynamic bytes, b: the bound
  kPlainSize,            // a: dynamic bytes, b: expected
  kConstSize,            // a: dynamic bytes
  kZipShort,
  kHuffmanShort,
  kSize,                 // a: message bytes, b: announced
  kConstRange,
  kZipTableRange,
  kZipPadding,
  kZipCount,
  kZipTotal,
  kHuffmanSymbols,       // a: k
  kHuffmanTableSize,
  kHuffmanSymbolRange,
  kHuffmanSymbolOrder,
  kHuffmanLength,
  kHuffmanPadding,
  kHuffmanKraft,
  kHuffmanOver,
  kHuffmanUnder,
  kCodes,                // a segment's codes (found by the section decoders)
};

// Trivial types (no member initializers), so that a kernel can hold them in
// shared memory: value-initialise them (Fault{}, Tables{}) for zeros.
struct Fault {
  FaultKind kind;  // kNone (0): no fault
  int32_t dtype;   // the expected dtype (for kDtype's message)
  int64_t a, b;
};

DQ_HD Fault fault(FaultKind k, int64_t a = 0, int64_t b = 0) {
  Fault f{};
  f.kind = k;
  f.a = a;
  f.b = b;
  return f;
}

DQ_HD int64_t zip_section_bytes(const Layout& L, int64_t n_esc) {
  return kZipTableBytes + 2 * L.segments + 3 * L.groups + n_esc;
}
// The Huffman section's table with k symbols: k-1, the symbols, the lengths, the segment sizes.
DQ_HD int64_t huff_header_bytes(const Layout& L, int k) { return 1 + k + (k + 1) / 2 + 2 * L.segments; }

// h <- the 16-byte header at p; its fields checked against (dtype, L).
DQ_HD Fault check_header(const uint8_t* p, DType dtype, const Layout& L, Header& h) {
  memcpy(&h, p, kHeaderBytes);
  if (h.magic != kMagic) return fault(FaultKind::kMagic, h.magic);
  if (h.version != kVersion) return fault(FaultKind::kVersion, h.version);
  if (crc16(p, kHeaderBytes - 2) != h.check) return fault(FaultKind::kChecksum);
  if (h.dtype != uint8_t(dtype)) return fault(FaultKind::kDtype, h.dtype);
  if (int64_t(h.count) != L.n) return fault(FaultKind::kCount, h.count, L.n);
  if (h.reserved != 0) return fault(FaultKind::kReserved);
  if (h.format >= kNumFormats) return fault(FaultKind::kFormat, h.format);
  const int64_t d = h.dynamic_bytes;
  if (d > L.plain_bytes) return fault(FaultKind::kDynamicBound, d, L.plain_bytes);
  switch (ExpFormat(h.format)) {
    case ExpFormat::kPlain:
      if (d != L.plain_bytes) return fault(FaultKind::kPlainSize, d, L.plain_bytes);
      break;
    case ExpFormat::kConst:
      if (L.body == 0 || d != 1) return fault(FaultKind::kConstSize, d);
      break;
    case ExpFormat::kZip:
      if (L.body == 0 || d < zip_section_bytes(L, 0)) return fault(FaultKind::kZipShort);
      break;
    case ExpFormat::kHuffman:
      if (L.body == 0 || d < huff_header_bytes(L, 2)) return fault(FaultKind::kHuffmanShort);
      break;
  }
  return Fault{};
}

// What a section's tables say, where its parts start (relative to the section).
struct Tables {
  uint8_t constant;       // const
  uint8_t zip_table[8];   // zip: code -> exponent (entry 0 unused)
  int k;                  // Huffman: symbols (at section + 1)
  uint8_t len[256];       // Huffman: their code lengths
  int64_t meta_offset;    // zip / Huffman: the S uint16 per-segment sizes
  int64_t planes_offset;  // zip: the code planes
  int64_t payload_offset;  // zip: escapes; Huffman: streams
  int64_t payload_bytes;
};

// The tables of a section of d bytes in `format` (a header check_header
// passed), at sec: reads at most min(d, huff_header_bytes(L, 256)) bytes.
DQ_HD Fault check_tables(ExpFormat format, const uint8_t* sec, int64_t d, DType dtype, const Layout& L,
                         Tables& t) {
  const int alphabet = exp_alphabet(dtype);
  const int64_t S = L.segments, G = L.groups;
  switch (format) {
    case ExpFormat::kPlain:
      return Fault{};
    case ExpFormat::kConst:
      if (sec[0] >= alphabet) return fault(FaultKind::kConstRange);
      t.constant = sec[0];
      return Fault{};
    case ExpFormat::kZip:
      t.zip_table[0] = 0;
      for (int i = 0; i < kZipCodes; ++i) {
        if (sec[i] >= alphabet) return fault(FaultKind::kZipTableRange);
        t.zip_table[i + 1] = sec[i];
      }
      if (sec[kZipCodes] != 0) return fault(FaultKind::kZipPadding);
      t.meta_offset = kZipTableBytes;
      t.planes_offset = kZipTableBytes + 2 * S;
      t.payload_offset = t.planes_offset + 3 * G;
      t.payload_bytes = d - t.payload_offset;
      return Fault{};
    case ExpFormat::kHuffman: {
      const int k = int(sec[0]) + 1;
      if (k < 2 || k > alphabet) return fault(FaultKind::kHuffmanSymbols, k);
      const int64_t hb = huff_header_bytes(L, k);
      if (hb > d) return fault(FaultKind::kHuffmanTableSize);
      const uint8_t* sym = sec + 1;
      const uint8_t* nib = sym + k;
      uint32_t kraft = 0;
      for (int i = 0; i < k; ++i) {
        if (sym[i] >= alphabet) return fault(FaultKind::kHuffmanSymbolRange);
        if (i > 0 && sym[i] <= sym[i - 1]) return fault(FaultKind::kHuffmanSymbolOrder);
        t.len[i] = uint8_t((nib[i / 2] >> (4 * (i & 1))) & 0xf);
        if (t.len[i] < 1 || t.len[i] > kMaxCodeLen) return fault(FaultKind::kHuffmanLength);
        kraft += 1u << (kMaxCodeLen - t.len[i]);
      }
      if ((k & 1) && (nib[k / 2] >> 4) != 0) return fault(FaultKind::kHuffmanPadding);
      if (kraft > uint32_t(kDecodeTableSize)) return fault(FaultKind::kHuffmanKraft);
      t.k = k;
      t.meta_offset = 1 + k + (k + 1) / 2;
      t.payload_offset = hb;
      t.payload_bytes = d - hb;
      return Fault{};
    }
  }
  return fault(FaultKind::kFormat, int64_t(format));  // unreachable: check_header refused it
}

// Segment s of a zip section announces cnt escapes: at most its exponents.
DQ_HD bool zip_count_ok(uint32_t cnt, int64_t body, int64_t s) { return cnt <= uint32_t(segment_count(body, s)); }

// The per-segment sizes (escapes, stream bytes) sum to `total`: they must fill the payload exactly.
DQ_HD Fault check_segment_total(ExpFormat format, uint64_t total, int64_t payload_bytes) {
  if (format == ExpFormat::kZip) {
    if (total != uint64_t(payload_bytes)) return fault(FaultKind::kZipTotal);
  } else if (format == ExpFormat::kHuffman) {
    if (total > uint64_t(payload_bytes)) return fault(FaultKind::kHuffmanOver);
    if (total < uint64_t(payload_bytes)) return fault(FaultKind::kHuffmanUnder);
  }
  return Fault{};
}

}  // namespace lossless
}  // namespace dynamiq
