// Wire format and per-element math of the lossless exponent-coding codec
// (mode "lossless"). Everything here is __host__ __device__ and torch-free:
// the CPU loops (lossless_codec.cc) and the CUDA kernels
// (cuda/lossless_encode_kernels.cu, cuda/lossless_decode_kernels.cu) call the
// same functions.
//
// A block of n values (bf16, fp16 or fp32) is split into the exponent field
// and the rest (sign and mantissa, "SM"). SM bits are kept verbatim at a fixed
// stride; the exponents are coded. n = 8*G + r: the first 8G values ("body")
// are split, the last r < 8 values ("tail") travel verbatim.
//
// ---- Message = static part + dynamic part ------------------------------------
// Static part (size known to both sides from dtype and n):
//   [0, 16)        Header (below)
//   [16, 16+SM)    SM planes of the 8G body values:
//                    bf16: 8G bytes, byte i = sign<<7 | mantissa[6:0] of value i
//                    fp16: 8G bytes of mantissa[7:0], then 3 bit planes of G
//                          bytes each: plane 0 = mantissa bit 8, plane 1 =
//                          mantissa bit 9, plane 2 = sign
//                    fp32: 8G little-endian uint16 of mantissa[15:0], then 8G
//                          bytes of sign<<7 | mantissa[22:16]
//                  A bit plane byte g holds bit j of value 8g+j at bit j.
//   [.., +r*size)  the r tail values verbatim (little-endian)
// Dynamic part (header.dynamic_bytes bytes): the exponent section of the 8G
// body exponents, in one of four formats (header.format):
//   kPlain   (0)  bf16/fp32: 8G bytes, one exponent per byte; fp16: 5 bit
//                 planes of G bytes (plane k = exponent bit k). Exactly the
//                 bits the exponents take raw, so a plain message is raw + 16.
//   kConst   (1)  1 byte: the exponent every body value has.
//   kZip     (2)  ZipCCL: [0,7) the 7 exponents of codes 1..7, [7] zero;
//                 S little-endian uint16: escapes per segment;
//                 3 bit planes of G bytes (plane k = code bit k; code 0 =
//                 escape); then one byte per escaped exponent, in order.
//   kHuffman (3)  canonical Huffman, lengths 1..11: [0] k-1 (k >= 2 symbols);
//                 k symbols, strictly increasing; ceil(k/2) bytes of 4-bit
//                 code lengths (symbol 2i in the low nibble of byte i);
//                 S little-endian uint16: bytes of each segment's bit stream;
//                 then the S bit streams, each byte-aligned, LSB first, codes
//                 stored bit-reversed so a decoder peeks the low 11 bits.
// A segment is kSegment = 1024 consecutive body exponents (the last may be
// shorter); S = ceil(8G / 1024). Segments decode independently (a GPU warp
// each; interleaved on the CPU).
//
// The encoder picks the smallest section (ties: plain, const, zip, Huffman).
// Plain is always possible, so a message is never more than raw + 16 bytes;
// exactly raw is impossible for a fixed-size static part (a raw fallback must
// still say it is raw, and every static prefix is a possible raw prefix).
//
// Validation (every decoder entry point): magic, version, dtype, count,
// format, reserved == 0, CRC-16 of bytes [0,14); dynamic_bytes within the
// format's bounds; every table and offset checked before it is read.
#pragma once

#include "kernels/base/bytes.h"
#include "kernels/base/common.h"
#include "kernels/base/float_bits.h"

namespace dynamiq {
namespace lossless {

constexpr uint8_t kMagic = 0x4c;  // 'L'
constexpr uint8_t kVersion = 1;
constexpr int kHeaderBytes = 16;
constexpr int kGroup = 8;           // values per bit-plane byte
constexpr int kSegment = 1024;      // exponents per independently decodable segment
constexpr int kMaxCodeLen = 11;     // Huffman length limit; decode table 2^11 entries
constexpr int kDecodeTableSize = 1 << kMaxCodeLen;
constexpr int kZipCodes = 7;        // ZipCCL: 7 coded exponents + escape code 0
constexpr int kZipTableBytes = 8;
constexpr int64_t kMaxBlockValues = (int64_t(1) << 31) - 1;

enum class ExpFormat : uint8_t { kPlain = 0, kConst = 1, kZip = 2, kHuffman = 3 };
constexpr int kNumFormats = 4;
inline const char* exp_format_name(ExpFormat f) {
  switch (f) {
    case ExpFormat::kPlain: return "plain";
    case ExpFormat::kConst: return "const";
    case ExpFormat::kZip: return "zip";
    case ExpFormat::kHuffman: return "huffman";
  }
  return "?";
}

// Message header, little-endian, 16 bytes, first in every message.
struct Header {
  uint8_t magic;           // kMagic
  uint8_t version;         // kVersion
  uint8_t dtype;           // DType value (0 fp32, 1 bf16, 2 fp16)
  uint8_t format;          // ExpFormat of the dynamic part
  uint32_t count;          // values in the block (n)
  uint32_t dynamic_bytes;  // bytes of the dynamic part
  uint16_t reserved;       // 0
  uint16_t check;          // CRC-16/CCITT-FALSE of bytes [0, 14)
};
static_assert(sizeof(Header) == kHeaderBytes, "lossless header must be 16 bytes");

// CRC-16/CCITT-FALSE (poly 0x1021, init 0xffff): detects every error burst of
// up to 16 bits, so any single corrupted header byte is caught.
DQ_HD uint16_t crc16(const uint8_t* p, int n) {
  uint32_t c = 0xffffu;
  for (int i = 0; i < n; ++i) {
    c ^= uint32_t(p[i]) << 8;
    for (int b = 0; b < 8; ++b) c = (c & 0x8000u) ? ((c << 1) ^ 0x1021u) & 0xffffu : (c << 1) & 0xffffu;
  }
  return uint16_t(c);
}

// Writes the header of a message (its CRC included) at out, byte by byte: the
// CPU encoder and the GPU one (whose last size_kernel block writes it) share it.
DQ_HD void write_header(uint8_t* out, uint8_t dtype, uint32_t count, uint8_t format, uint32_t dynamic_bytes) {
  out[0] = kMagic;
  out[1] = kVersion;
  out[2] = dtype;
  out[3] = format;
  store_u32(out + 4, count);
  store_u32(out + 8, dynamic_bytes);
  store_u16(out + 12, 0);  // reserved
  store_u16(out + 14, crc16(out, kHeaderBytes - 2));
}

// ---- SWAR bit planes over groups of 8 values ---------------------------------

// x holds 8 bytes (byte j = value j); returns the byte whose bit j is bit k of byte j.
DQ_HD uint8_t pack_plane(uint64_t x, int k) {
  return uint8_t((((x >> k) & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
}
// Inverse: byte j of the result is bit j of p (0 or 1).
DQ_HD uint64_t unpack_plane(uint8_t p) {
  uint64_t x = (uint64_t(p) * 0x0101010101010101ull) & 0x8040201008040201ull;
  return ((x + 0x7f7f7f7f7f7f7f7full) >> 7) & 0x0101010101010101ull;
}

// ---- per-dtype split and merge -------------------------------------------------

template <DType T>
struct Split;

template <>
struct Split<DType::kBF16> {
  using word = uint16_t;
  static constexpr int kExpBits = 8;
  static constexpr int kAlphabet = 256;
  DQ_HD static uint8_t exponent(word h) { return uint8_t(h >> 7); }
  DQ_HD static uint8_t sm(word h) { return uint8_t(((h >> 8) & 0x80u) | (h & 0x7fu)); }
  DQ_HD static word merge(uint8_t e, uint8_t sm) {
    return word(((sm & 0x80u) << 8) | (uint32_t(e) << 7) | (sm & 0x7fu));
  }
};

template <>
struct Split<DType::kF16> {
  using word = uint16_t;
  static constexpr int kExpBits = 5;
  static constexpr int kAlphabet = 32;
  DQ_HD static uint8_t exponent(word h) { return uint8_t((h >> 10) & 0x1fu); }
  DQ_HD static uint8_t lo(word h) { return uint8_t(h); }
  // bit 0 = mantissa bit 8, bit 1 = mantissa bit 9, bit 2 = sign
  DQ_HD static uint8_t hi3(word h) { return uint8_t(((h >> 8) & 3u) | ((h >> 13) & 4u)); }
  DQ_HD static word merge(uint8_t e, uint8_t lo, uint8_t hi3) {
    return word(((hi3 & 4u) << 13) | (uint32_t(e) << 10) | ((hi3 & 3u) << 8) | lo);
  }
};

template <>
struct Split<DType::kF32> {
  using word = uint32_t;
  static constexpr int kExpBits = 8;
  static constexpr int kAlphabet = 256;
  DQ_HD static uint8_t exponent(word u) { return uint8_t(u >> 23); }
  DQ_HD static uint16_t lo16(word u) { return uint16_t(u); }
  DQ_HD static uint8_t hi(word u) { return uint8_t(((u >> 24) & 0x80u) | ((u >> 16) & 0x7fu)); }
  DQ_HD static word merge(uint8_t e, uint16_t lo16, uint8_t hi) {
    return ((uint32_t(hi) & 0x80u) << 24) | (uint32_t(e) << 23) | ((uint32_t(hi) & 0x7fu) << 16) | lo16;
  }
};

DQ_HD int exp_bits(DType t) { return t == DType::kF16 ? 5 : 8; }
DQ_HD int exp_alphabet(DType t) { return t == DType::kF16 ? 32 : 256; }

// Sizes and offsets of a block of n values, known to both ends from (dtype, n).
struct Layout {
  int64_t n = 0;
  int64_t groups = 0;        // G
  int64_t body = 0;          // 8G exponents in the dynamic part
  int64_t tail = 0;          // r values verbatim
  int64_t segments = 0;      // S
  int64_t sm_bytes = 0;      // SM planes
  int64_t tail_offset = 0;   // of the tail values in the message
  int64_t static_bytes = 0;  // header + SM + tail
  int64_t plain_bytes = 0;   // plain exponent section = the largest dynamic part
};

DQ_HD Layout make_layout(DType t, int64_t n) {
  Layout L;
  L.n = n;
  L.groups = n / kGroup;
  L.body = L.groups * kGroup;
  L.tail = n - L.body;
  L.segments = (L.body + kSegment - 1) / kSegment;
  const int64_t G = L.groups;
  L.sm_bytes = t == DType::kBF16 ? 8 * G : t == DType::kF16 ? 11 * G : 24 * G;
  L.tail_offset = kHeaderBytes + L.sm_bytes;
  L.static_bytes = L.tail_offset + L.tail * dtype_size(t);
  L.plain_bytes = t == DType::kF16 ? 5 * G : 8 * G;
  return L;
}

// Symbols in segment s of a body of `body` exponents.
DQ_HD int segment_count(int64_t body, int64_t s) {
  const int64_t b = s * kSegment, e = b + kSegment < body ? b + kSegment : body;
  return int(e - b);
}

// ---- splitting one group of 8 values into the static part ---------------------
// out = message + kHeaderBytes (start of SM planes); g = group index.

template <DType T>
DQ_HD void split_group(const typename Split<T>::word* v, int64_t g, int64_t G, uint8_t* sm,
                       uint8_t* exps) {
  using S = Split<T>;
  if constexpr (T == DType::kBF16) {
    for (int j = 0; j < 8; ++j) {
      sm[8 * g + j] = S::sm(v[8 * g + j]);
      exps[8 * g + j] = S::exponent(v[8 * g + j]);
    }
  } else if constexpr (T == DType::kF16) {
    uint64_t hi = 0;
    for (int j = 0; j < 8; ++j) {
      sm[8 * g + j] = S::lo(v[8 * g + j]);
      exps[8 * g + j] = S::exponent(v[8 * g + j]);
      hi |= uint64_t(S::hi3(v[8 * g + j])) << (8 * j);
    }
    for (int k = 0; k < 3; ++k) sm[8 * G + k * G + g] = pack_plane(hi, k);
  } else {
    for (int j = 0; j < 8; ++j) {
      store_u16(sm + 2 * (8 * g + j), S::lo16(v[8 * g + j]));
      sm[16 * G + 8 * g + j] = S::hi(v[8 * g + j]);
      exps[8 * g + j] = S::exponent(v[8 * g + j]);
    }
  }
}

template <DType T>
DQ_HD void merge_group(const uint8_t* sm, const uint8_t* exps, int64_t g, int64_t G,
                       typename Split<T>::word* v) {
  using S = Split<T>;
  if constexpr (T == DType::kBF16) {
    for (int j = 0; j < 8; ++j) v[8 * g + j] = S::merge(exps[8 * g + j], sm[8 * g + j]);
  } else if constexpr (T == DType::kF16) {
    const uint64_t hi = unpack_plane(sm[8 * G + g]) | (unpack_plane(sm[9 * G + g]) << 1) |
                        (unpack_plane(sm[10 * G + g]) << 2);
    for (int j = 0; j < 8; ++j)
      v[8 * g + j] = S::merge(exps[8 * g + j], sm[8 * g + j], uint8_t(hi >> (8 * j)));
  } else {
    for (int j = 0; j < 8; ++j)
      v[8 * g + j] = S::merge(exps[8 * g + j], load_u16(sm + 2 * (8 * g + j)), sm[16 * G + 8 * g + j]);
  }
}

// ---- plain fp16 exponents: 5 bit planes ----------------------------------------

DQ_HD void plain5_encode_group(const uint8_t* exps, int64_t g, int64_t G, uint8_t* planes) {
  const uint64_t x = load_u64(exps + 8 * g);
  for (int k = 0; k < 5; ++k) planes[k * G + g] = pack_plane(x, k);
}
DQ_HD void plain5_decode_group(const uint8_t* planes, int64_t g, int64_t G, uint8_t* exps) {
  uint64_t x = 0;
  for (int k = 0; k < 5; ++k) x |= unpack_plane(planes[k * G + g]) << k;
  store_u64(exps + 8 * g, x);
}

// ---- ZipCCL codes -------------------------------------------------------------
// code_of[sym] in 0..7 (0 = escape); table[code] = symbol for codes 1..7.

// Encodes group g (8 exponents); appends escaped exponents at esc[*n_esc].
DQ_HD void zip_encode_group(const uint8_t* exps, int64_t g, int64_t G, const uint8_t* code_of,
                            uint8_t* planes, uint8_t* esc, uint32_t* n_esc) {
  uint64_t codes = 0;
  for (int j = 0; j < 8; ++j) {
    const uint8_t e = exps[8 * g + j];
    const uint8_t c = code_of[e];
    codes |= uint64_t(c) << (8 * j);
    if (c == 0) esc[(*n_esc)++] = e;
  }
  for (int k = 0; k < 3; ++k) planes[k * G + g] = pack_plane(codes, k);
}

// Decodes group g; reads escapes from esc[*pos] while *pos < esc_end.
// Returns false if the group needs an escape past esc_end.
DQ_HD bool zip_decode_group(const uint8_t* planes, int64_t g, int64_t G, const uint8_t* table,
                            const uint8_t* esc, uint32_t* pos, uint32_t esc_end, uint8_t* exps) {
  const uint64_t codes = unpack_plane(planes[g]) | (unpack_plane(planes[G + g]) << 1) |
                         (unpack_plane(planes[2 * G + g]) << 2);
  bool ok = true;
  for (int j = 0; j < 8; ++j) {
    const uint8_t c = uint8_t(codes >> (8 * j));
    uint8_t e = table[c];
    if (c == 0) {
      if (*pos < esc_end) {
        e = esc[(*pos)++];
      } else {
        ok = false;
        e = 0;
      }
    }
    exps[8 * g + j] = e;
  }
  return ok;
}

// ---- canonical Huffman -------------------------------------------------------

// Reverses the low `len` bits of `code`.
DQ_HD uint32_t reverse_bits(uint32_t code, int len) {
  uint32_t r = 0;
  for (int i = 0; i < len; ++i) r |= ((code >> i) & 1u) << (len - 1 - i);
  return r;
}

// Bit writer: codes are appended LSB first; at most 63 bits are pending.
struct HuffWriter {
  uint64_t acc = 0;
  int nbits = 0;
  uint32_t pos = 0;  // bytes written
};
DQ_HD void huff_put(HuffWriter& w, uint32_t code, int len) {
  w.acc |= uint64_t(code) << w.nbits;
  w.nbits += len;
}
// Writes 4 bytes if at least 32 bits are pending (exact: never writes past them).
DQ_HD void huff_flush32(HuffWriter& w, uint8_t* out) {
  if (w.nbits >= 32) {
    store_u32(out + w.pos, uint32_t(w.acc));
    w.pos += 4;
    w.acc >>= 32;
    w.nbits -= 32;
  }
}
// Branch-free flush of every complete byte; stores 8 bytes, so `out` needs 8
// bytes of slack past the stream (the CPU encoder writes to a private buffer).
DQ_HD void huff_flush_slack(HuffWriter& w, uint8_t* out) {
  store_u64(out + w.pos, w.acc);
  const int bytes = w.nbits >> 3;
  w.pos += uint32_t(bytes);
  w.acc >>= 8 * bytes;  // bytes <= 7: at most 63 bits pending
  w.nbits &= 7;
}
// Writes the remaining bits (the last byte zero-padded); returns the stream bytes.
DQ_HD uint32_t huff_finish(HuffWriter& w, uint8_t* out) {
  while (w.nbits > 0) {
    out[w.pos++] = uint8_t(w.acc);
    w.acc >>= 8;
    w.nbits -= 8;
  }
  w.nbits = 0;
  return w.pos;
}

// Encodes `count` symbols into out (codes already bit-reversed). Writes
// exactly ceil(bits / 8) bytes and returns that number. (GPU: one thread per
// segment; the CPU interleaves segments with the same huff_put.)
DQ_HD uint32_t huff_encode_segment(const uint8_t* syms, int count, const uint16_t* code,
                                   const uint8_t* len, uint8_t* out) {
  HuffWriter w;
  for (int i = 0; i < count; ++i) {
    huff_put(w, code[syms[i]], len[syms[i]]);
    huff_flush32(w, out);
  }
  return huff_finish(w, out);
}

// Bits of a segment's stream (before byte alignment).
DQ_HD uint64_t huff_segment_bits(const uint8_t* syms, int count, const uint8_t* len) {
  uint64_t b = 0;
  for (int i = 0; i < count; ++i) b += len[syms[i]];
  return b;
}

// Bit reader over one segment's stream. `avail` bytes from seg may be read
// (>= the segment's own bytes); nothing past them is ever touched.
struct HuffReader {
  const uint8_t* seg = nullptr;
  uint64_t avail = 0;
  uint64_t pos = 0;   // bits consumed
  uint32_t bad = 0;   // an invalid code was seen
};
// True if the next 8 bytes are readable: then huff_decode5 may run.
DQ_HD bool huff_fast(const HuffReader& r) { return (r.pos >> 3) + 8 <= r.avail; }
// Five symbols from one 8-byte load (>= 57 bits, 5 codes of <= 11 bits).
// table[peek of 11 bits] = symbol | length << 8, length 0 = invalid.
DQ_HD void huff_decode5(HuffReader& r, const uint16_t* table, uint8_t* out) {
  constexpr uint32_t kMask = kDecodeTableSize - 1;
  uint64_t w = load_u64(r.seg + (r.pos >> 3)) >> (r.pos & 7);
  uint32_t used = 0, bad = 0;
  for (int j = 0; j < 5; ++j) {
    const uint32_t e = table[uint32_t(w) & kMask];
    const uint32_t l = e >> 8;
    bad |= uint32_t(l == 0);
    out[j] = uint8_t(e);
    w >>= l;
    used += l;
  }
  r.pos += used;
  r.bad |= bad;
}
// One symbol with a bounded load (stream ends).
DQ_HD void huff_decode1(HuffReader& r, const uint16_t* table, uint8_t* out) {
  constexpr uint32_t kMask = kDecodeTableSize - 1;
  const uint64_t byte = r.pos >> 3;
  const uint64_t w = (byte < r.avail ? load_u64_bounded(r.seg + byte, r.avail - byte) : 0) >> (r.pos & 7);
  const uint32_t e = table[uint32_t(w) & kMask];
  const uint32_t l = e >> 8;
  r.bad |= uint32_t(l == 0);
  *out = uint8_t(e);
  r.pos += l;
}
// Valid iff every code was valid and the stream's seg_bytes were exactly consumed.
DQ_HD bool huff_reader_ok(const HuffReader& r, uint32_t seg_bytes) {
  return r.bad == 0 && (r.pos + 7) / 8 == seg_bytes;
}

// Multi-symbol decoding (CPU fast path): mtable[peek of 11 bits] holds up to
// three whole codes that fit in those 11 bits:
//   bits 0..23 the symbols, 24..27 bits consumed, 28..29 symbol count (1..3),
//   bit 31 set if the first code is invalid (count 1, so decoding progresses).
constexpr uint32_t kMultiInvalid = 1u << 31;
DQ_HD uint32_t huff_multi_entry(const uint16_t* table, uint32_t peek) {
  constexpr uint32_t kMask = kDecodeTableSize - 1;
  const uint32_t e = table[peek & kMask];
  uint32_t used = e >> 8;
  if (used == 0) return kMultiInvalid | (1u << 28) | (1u << 24);
  uint32_t out = e & 0xffu, n = 1;
  while (n < 3) {
    const uint32_t f = table[(peek >> used) & kMask];
    const uint32_t l = f >> 8;
    if (l == 0 || used + l > uint32_t(kMaxCodeLen)) break;
    out |= (f & 0xffu) << (8 * n);
    used += l;
    ++n;
  }
  return out | (used << 24) | (n << 28);
}
// Five lookups from one 8-byte load; writes 4 bytes per lookup at out[n]
// (so out needs 16 bytes of room); returns the symbols produced (5..15).
DQ_HD int huff_decode_multi5(HuffReader& r, const uint32_t* mtable, uint8_t* out) {
  constexpr uint32_t kMask = kDecodeTableSize - 1;
  uint64_t w = load_u64(r.seg + (r.pos >> 3)) >> (r.pos & 7);
  uint32_t used = 0, bad = 0;
  int n = 0;
  for (int j = 0; j < 5; ++j) {
    const uint32_t e = mtable[uint32_t(w) & kMask];
    store_u32(out + n, e);
    const uint32_t l = (e >> 24) & 0xfu;
    n += int((e >> 28) & 3u);
    bad |= e >> 31;
    w >>= l;
    used += l;
  }
  r.pos += used;
  r.bad |= bad;
  return n;
}

// Decodes `count` symbols of one segment (seg_bytes long; `avail` readable).
// Returns false unless every code is valid and the stream is exactly consumed.
DQ_HD bool huff_decode_segment(const uint8_t* seg, uint32_t seg_bytes, uint64_t avail, int count,
                               const uint16_t* table, uint8_t* syms) {
  HuffReader r;
  r.seg = seg;
  r.avail = avail;
  int i = 0;
  while (i + 5 <= count && huff_fast(r)) {
    huff_decode5(r, table, syms + i);
    i += 5;
  }
  for (; i < count; ++i) huff_decode1(r, table, syms + i);
  return huff_reader_ok(r, seg_bytes);
}

// The canonical codes of k symbols with code lengths len[i] (1..kMaxCodeLen,
// Kraft sum <= 1, checked by the caller), bit-reversed for the LSB-first
// streams: within a length, codes ascend with the symbol's index.
DQ_HD void huff_reversed_codes(int k, const uint8_t* len, uint16_t* rc) {
  int count[kMaxCodeLen + 1] = {0};
  for (int i = 0; i < k; ++i) ++count[len[i]];
  uint32_t next[kMaxCodeLen + 2] = {0};
  uint32_t code = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    code = (code + uint32_t(count[l - 1])) << 1;
    next[l] = code;
  }
  // next[1] = 0 (count[0] = 0)
  for (int i = 0; i < k; ++i) rc[i] = uint16_t(reverse_bits(next[len[i]]++, len[i]));
}

// The decode-table entries of symbol `sym` with reversed code rc of length l:
// every index whose low l bits are rc (prefix-free codes: disjoint sets).
DQ_HD void huff_fill_entries(uint8_t sym, uint16_t rc, int l, uint16_t* dtable) {
  const uint16_t entry = uint16_t(sym | (l << 8));
  for (uint32_t j = rc; j < uint32_t(kDecodeTableSize); j += (1u << l)) dtable[j] = entry;
}

// Fills the decode table from canonical code lengths. sym[i] strictly
// increasing, len[i] in 1..kMaxCodeLen, Kraft sum <= 1 (checked by the
// caller). Entries of an incomplete code's unused space stay 0 (invalid).
// code_out/len_out (optional, indexed by symbol) receive the encoder table.
DQ_HD void huff_build_tables(int k, const uint8_t* sym, const uint8_t* len, uint16_t* dtable,
                             uint16_t* code_out, uint8_t* len_out) {
  uint16_t rc[256];
  huff_reversed_codes(k, len, rc);
  if (dtable)
    for (int i = 0; i < kDecodeTableSize; ++i) dtable[i] = 0;
  for (int i = 0; i < k; ++i) {
    if (code_out) code_out[sym[i]] = rc[i];
    if (len_out) len_out[sym[i]] = len[i];
    if (dtable) huff_fill_entries(sym[i], rc[i], len[i], dtable);
  }
}

}  // namespace lossless
}  // namespace dynamiq
