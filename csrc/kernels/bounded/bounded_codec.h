// The error-bounded codec (mode "bounded"): bins of width 2e, 1-D Lorenzo
// prediction, per-32-value code lengths (bounded_format.h). Every value it
// decodes is within e = plan.error_bound of the value it encoded; values it
// cannot bin travel raw (exact). Plan: the identity plan (natural order, no
// bias), e set by the scheme. Messages have a static part (header, anchors,
// code lengths) and a dynamic part (the payloads).
#pragma once

#include <string>

#include "kernels/bounded/bounded_format.h"
#include "kernels/codec.h"

namespace dynamiq {

// What the encoder did (statistics for tests and the benchmark).
struct BoundedBlockInfo {
  int64_t values = 0;
  int64_t code_blocks = 0;
  int64_t zero_blocks = 0;  // code length 0
  int64_t raw_blocks = 0;
};

// Encodes the n float values v (n <= the block's values) of units of `unit`
// values with bound e into out (static + dynamic part). Returns the bytes.
// Exposed for tests and the benchmark; the codec calls it per block.
size_t bounded_encode(const float* v, int64_t n, int32_t unit, float e, uint8_t* out,
                      BoundedBlockInfo* info = nullptr);
// Decodes a message of in_bytes into n floats. Throws MalformedMessage.
void bounded_decode(const uint8_t* in, size_t in_bytes, int64_t n, int32_t unit, float e, float* v);
// Sizes for n values in units of `unit`.
size_t bounded_static_bytes_for(int64_t n, int32_t unit);
size_t bounded_max_dynamic_bytes_for(int64_t n, int32_t unit);

class BoundedCodec final : public Codec {
 public:
  std::string name() const override { return "bounded"; }
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
};

// Number of compressions whose error reaches one coordinate of a collective
// (kind: config.h Collective) on `world` ranks, the same for every topology
// (every partial sum compressed once per hop; an all-reduce's final sum
// compressed once and forwarded as bytes, a reduce-scatter's kept as it is):
// the end-to-end error of a sum is at most this many times e. See README.md
// for the per-topology derivation.
int bounded_compressions(int kind, int world);

}  // namespace dynamiq
