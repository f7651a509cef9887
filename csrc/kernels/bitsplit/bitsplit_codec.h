// The bit-split codec (mode "bitsplit"): INT2-INT8 asymmetric group
// quantisation with bit splitting, optional spike reserving and integer log
// scales (FlashCommunication V2). The wire format and the per-group math are
// in bitsplit_format.h; this is the CPU implementation of the four codec roles.
//
// Plan: natural order, no bias. A unit is a whole number of groups
// (bitsplit_unit_groups), so blocks start at group boundaries; the last unit
// of the bucket may be partial, and its last group is padded on the wire.
// Messages are fixed-size: wire_offset is exact.
#pragma once

#include <memory>

#include "kernels/bitsplit/bitsplit_format.h"
#include "kernels/codec.h"

namespace dynamiq {

// The user's knobs, resolved (defaults applied, ranges checked).
struct BitsplitParams {
  int bits = 4;
  int group = 32;
  bool spikes = false;
  bool log_scales = false;
};

// Applies the paper's defaults (group 0 -> 128 for INT5-INT8, 32 for
// INT2-INT4; spike_reserve -1 -> on for 2 and 3 bits) and checks ranges.
// Throws Error naming the knob and its allowed values.
BitsplitParams resolve_bitsplit_params(double bits, int group_size, int spike_reserve,
                                       bool log_scales);

class BitsplitCodec final : public Codec {
 public:
  explicit BitsplitCodec(const BitsplitParams& p);

  std::string name() const override { return "bitsplit"; }
  const BitsplitParams& params() const { return p_; }
  BitsplitFormat format(DType dtype) const;
  // Elements per plan unit: a whole number of groups, about 1024 elements.
  int32_t unit() const { return unit_; }
  // Wire bytes of one group for a bucket of this dtype.
  int64_t group_bytes(DType dtype) const { return bitsplit_group_bytes(format(dtype)); }
  // Natural-order plan with `num_chunks` chunks of nearly equal unit counts.
  Plan make_plan(DType dtype, int64_t numel, int num_chunks) const;
  // Number of groups of block b (a partial last group counts as one).
  int64_t block_groups(const Plan& plan, const Block& b) const;

  size_t static_bytes(const Plan& plan, const Block& b) const override;
  size_t compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                  uint8_t* out) const override;
  void decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                  const Output& y) const override;
  void decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                             const Block& b, float* acc) const override;
  size_t decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, const RngCtx& rng,
                                          uint8_t* out) const override;
  void decompress_accumulate_output(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                                    const Block& b, const Output& y) const override;

 private:
  BitsplitParams p_;
  int32_t unit_;
};

}  // namespace dynamiq
