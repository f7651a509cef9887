// The identity codec: the uncompressed reference path (mode "none", and the
// exact fallback of every lossy mode).
//
// Wire format of a block [w0, w1): the elements [w0*unit, min(w1*unit, numel))
// of the bucket in its own dtype, little-endian, nothing else. Partial sums are
// accumulated in float32 and rounded to the bucket dtype at every hop (as NCCL
// does for 16-bit types), so a bf16 bucket travels as bf16.
//
// Requires an identity plan (no reordering, no bias).
#pragma once

#include <memory>

#include "kernels/codec.h"

namespace dynamiq {

class IdentityCodec final : public Codec {
 public:
  std::string name() const override { return "identity"; }
  size_t static_bytes(const Plan& plan, const Block& b) const override;
  const uint8_t* wire_view(const Local& x, const Plan& plan, const Block& b) const override;
  uint8_t* output_view(const Output& y, const Plan& plan, const Block& b) const override;
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

// Plan for the identity codec: natural order, `num_chunks` chunks of nearly
// equal size (in units of `unit` elements).
Plan make_identity_plan(DType dtype, int64_t numel, int num_chunks, int32_t unit = 256);

}  // namespace dynamiq
