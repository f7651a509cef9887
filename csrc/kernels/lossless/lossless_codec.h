// The lossless exponent-coding codec (mode "lossless"): bf16, fp16 and fp32
// buckets travel with their sign and mantissa bits verbatim and their
// exponents coded (ZipCCL 3-bit codes + escapes, or canonical Huffman with a
// per-block table, whichever is smaller; plain when neither helps). Wire
// format: lossless_format.h.
//
// Exactness: every value a rank sends is exactly the value mode "none" would
// send at the same hop. The arithmetic is IdentityCodec's own code, called
// on the same blocks (a lossless plan is the identity plan): received bytes
// are decoded to the bucket dtype, then IdentityCodec::decompress_accumulate,
// ::decompress_accumulate_recompress or ::decompress does the float32 sum,
// the rounding and the division, and the result is re-encoded. So NaN
// payloads, signed zeros, infinities and subnormals follow the same path
// bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/lossless/lossless_format.h"
#include "kernels/lossless/lossless_validate.h"

namespace dynamiq {

struct LosslessOptions {
  // Exponent formats the encoder may choose (bit f = lossless::ExpFormat f).
  // Plain is always allowed: it is the never-worse-than-raw fallback.
  uint32_t formats = 0xf;
};

// What the encoder did with one block.
struct LosslessBlockInfo {
  lossless::ExpFormat format = lossless::ExpFormat::kPlain;
  int64_t count = 0;          // values
  int64_t body = 0;           // exponents in the dynamic part
  int64_t static_bytes = 0;
  int64_t dynamic_bytes = 0;
  int32_t distinct = 0;       // distinct body exponents
  double entropy_bits = 0.0;  // sum over body exponents of -log2 p (block histogram)
  // Candidate section sizes (bytes; -1 = not applicable or not allowed).
  int64_t candidate_bytes[lossless::kNumFormats] = {-1, -1, -1, -1};
};

// ---- block-level API (the codec, the stats function and the benchmark use it) ----

// Static part, largest dynamic part, and largest message of a block of n values.
size_t lossless_static_bytes(DType dtype, int64_t n);
size_t lossless_max_dynamic_bytes(DType dtype, int64_t n);

// Encodes n values (bucket dtype storage) into out, which must hold
// lossless_static_bytes + lossless_max_dynamic_bytes bytes. Returns the
// message size (static + dynamic).
size_t lossless_encode(const void* values, DType dtype, int64_t n, uint8_t* out,
                       const LosslessOptions& opt = {}, LosslessBlockInfo* info = nullptr);

// Validates the header of a received static part and returns the announced
// dynamic size. Throws MalformedMessage on any inconsistency.
size_t lossless_dynamic_bytes(const uint8_t* static_part, DType dtype, int64_t n);

// Decodes a whole message of in_bytes bytes into n values. Throws
// MalformedMessage (never reads outside [in, in + in_bytes)).
void lossless_decode(const uint8_t* in, size_t in_bytes, DType dtype, int64_t n, void* values);

// Format of a valid message (for statistics and tests).
lossless::ExpFormat lossless_format_of(const uint8_t* msg);

// Throws Error unless 0 <= n <= lossless::kMaxBlockValues (the header's 32-bit
// count): every block-level entry point calls it first.
void lossless_check_count(int64_t n);

// Code lengths (1..maxlen) minimising sum(freq[i] * len[i]) subject to
// len[i] <= maxlen (package-merge). freq[i] > 0, k >= 2, 2^maxlen >= k.
void lossless_code_lengths(const uint64_t* freq, int k, int maxlen, uint8_t* len);

// ---- host-side plans shared by the CPU loops and the CUDA launchers -------------------
// Encoding is: split (SM planes, exponents) -> histogram of the 8G body
// exponents -> lossless_plan_encode (format choice and tables, on the host)
// -> section encode -> header. Decoding is: lossless_parse (every check, on
// the host) -> section decode -> merge. The CPU path (lossless_encode /
// lossless_decode) and the CUDA launchers (lossless_cuda.h) share the plans.

struct LosslessEncodePlan {
  lossless::Layout layout;
  lossless::ExpFormat format = lossless::ExpFormat::kPlain;
  int k = 0;                      // distinct body exponents
  uint8_t syms[256] = {};         // the distinct exponents, ascending
  uint64_t freq[256] = {};        // their counts
  uint8_t zip_code_of[256] = {};  // zip: exponent -> code 1..7, 0 = escape
  int64_t n_esc = 0;              // zip: escaped exponents
  uint16_t huff_code[256] = {};   // Huffman: bit-reversed code per exponent
  uint8_t huff_len[256] = {};     // Huffman: code length per exponent (0 = absent)
  uint8_t prefix[1 + 256 + 128] = {};  // section bytes before the per-segment table
  int32_t prefix_bytes = 0;
  int64_t section_bytes = 0;      // exact, except Huffman: an upper bound (byte alignment)
  int64_t candidate_bytes[lossless::kNumFormats] = {-1, -1, -1, -1};
  double entropy_bits = 0.0;      // sum of -log2 p over the body exponents
};

// Chooses the smallest allowed section for a block of n values whose body
// exponents have histogram hist[256] (ties: plain, const, zip, Huffman).
void lossless_plan_encode(DType dtype, int64_t n, const uint64_t* hist, const LosslessOptions& opt,
                          LosslessEncodePlan& plan);

// Writes the 16-byte header (with its CRC) at out.
void lossless_write_header(uint8_t* out, DType dtype, int64_t n, lossless::ExpFormat format,
                           uint32_t dynamic_bytes);

struct LosslessDecodePlan {
  lossless::Layout layout;
  lossless::ExpFormat format = lossless::ExpFormat::kPlain;
  uint32_t dynamic_bytes = 0;
  uint8_t constant = 0;                // const: the exponent
  uint8_t zip_table[8] = {};           // zip: code -> exponent (entry 0 unused)
  int64_t planes_offset = 0;           // zip: code planes, relative to the section
  int64_t payload_offset = 0;          // zip: escapes; Huffman: streams (relative to the section)
  int64_t payload_bytes = 0;
  std::vector<uint32_t> seg_start;     // S+1 prefix: zip escape index / Huffman stream byte offset
  std::vector<uint16_t> huff_table;    // Huffman: 2^11 entries, symbol | length << 8
};

// Validates a whole received message (sizes, header, section tables and
// offsets) and fills the plan. Throws MalformedMessage. What it cannot check
// without decoding (escape codes per segment, Huffman stream validity) the
// section decoders check.
void lossless_parse(const uint8_t* msg, size_t bytes, DType dtype, int64_t n, LosslessDecodePlan& plan);

// lossless_parse from the two places it reads, for a message held elsewhere:
// header = the message's
// first 16 bytes; sec = the first sec_bytes bytes of its dynamic part, where
// sec_bytes >= min(in_bytes - static_bytes, lossless_parse_prefix_bytes)
// (fewer: dynamiq::Error). in_bytes = the whole message's size. The checks,
// the messages and the plan are lossless_parse's; the payload (zip code
// planes and escapes, Huffman streams) is not read.
void lossless_parse_parts(const uint8_t* header, const uint8_t* sec, size_t sec_bytes, size_t in_bytes,
                          DType dtype, int64_t n, LosslessDecodePlan& plan);
// The most bytes of a dynamic part lossless_parse reads: the largest Huffman
// table (1 + 256 + 128 bytes) + 2 bytes per 1024-exponent segment.
size_t lossless_parse_prefix_bytes(DType dtype, int64_t n);

// The MalformedMessage text of a refused message ("lossless: ..."): the
// host parse's, and the CUDA decode's (whose device parse reports a Fault).
std::string lossless_fault_message(const lossless::Fault& f, DType dtype);

// ---- the codec --------------------------------------------------------------------

class LosslessCodec final : public Codec {
 public:
  explicit LosslessCodec(LosslessOptions opt = {}) : opt_(opt) {}
  std::string name() const override { return "lossless"; }
  const LosslessOptions& options() const { return opt_; }
  size_t static_bytes(const Plan& plan, const Block& b) const override;
  size_t max_dynamic_bytes(const Plan& plan, const Block& b) const override;
  size_t dynamic_bytes(const uint8_t* static_part, const Plan& plan, const Block& b) const override;
  size_t compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                  uint8_t* out) const override;
  void decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                  const Output& y) const override;
  void decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                             const Block& b, float* acc) const override;
  size_t decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, const RngCtx& rng,
                                          uint8_t* out) const override;

 private:
  LosslessOptions opt_;
  IdentityCodec id_;
};

// Plan of the lossless scheme: the identity plan (natural order, 256-value
// units, raw bytes as wire offsets), so blocks coincide with mode "none".
Plan make_lossless_plan(DType dtype, int64_t numel, int num_chunks);

// ---- per-tensor statistics ---------------------------------------------------------

// A tensor coded block by block as the collective codes one copy of it
// (blocks of about block_bytes raw bytes, at 256-value unit boundaries).
struct LosslessStats {
  DType dtype = DType::kF32;
  int64_t numel = 0;
  int64_t blocks = 0;
  int64_t raw_bytes = 0;
  int64_t coded_bytes = 0;      // all messages, headers included
  int64_t exponent_bytes = 0;   // dynamic parts (exponent sections incl. their tables)
  int64_t body_exponents = 0;   // exponents coded in dynamic parts
  double ratio = 1.0;           // coded_bytes / raw_bytes
  // Achieved bits per coded exponent (exponent_bytes * 8 / body_exponents).
  double exponent_bits = 0.0;
  // Order-0 entropy of the exponents of the whole tensor (bits per exponent),
  // and the mean of the per-block entropies (what a per-block table can reach).
  double exponent_entropy = 0.0;
  double block_exponent_entropy = 0.0;
  int64_t blocks_by_format[lossless::kNumFormats] = {0, 0, 0, 0};
};

LosslessStats lossless_stats(const void* data, DType dtype, int64_t numel,
                             int64_t block_bytes = 256 * 1024, const LosslessOptions& opt = {});

// Exponent bits per value of ZipCCL's sigma rule on the whole tensor: codes
// 1..7 = the 7 exponents from round(log2(sigma) - 5.35) up, escapes in full
// (3 + exp_bits * escape fraction). For the benchmark's comparison with the paper.
double zipccl_sigma_rule_bits(const void* data, DType dtype, int64_t numel);

}  // namespace dynamiq
