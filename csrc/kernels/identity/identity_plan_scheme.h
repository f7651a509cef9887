// The scheme of an exact codec without statistics over the identity plan
// (natural order, 256-element units, chunks of nearly equal unit counts):
// modes none and lossless, and exact test codecs (tests/cpp/negate_codec).
// Nothing to validate in the config and no local pass (an exact mode carries
// inf and NaN through). PlanInfo reports the raw width: for a variable-size
// codec the upper bound of a block (CallStats::bytes_sent has what was sent).
#pragma once

#include <string>
#include <utility>

#include "kernels/identity/identity_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {

template <class C>
class IdentityPlanScheme : public Scheme {
 public:
  template <class... CodecArgs>
  explicit IdentityPlanScheme(CodecArgs&&... args) : codec_(std::forward<CodecArgs>(args)...) {}
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return true; }
  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int, const float*, PlanState&,
                 PlanInfo& info) const override {
    info.bits_per_coord = 8.0 * dtype_size(dtype);
    return make_identity_plan(dtype, numel, num_chunks);
  }
  // Reduce-scatter and all-gather: any unit works for an identity plan, so
  // one that divides the shard (identity_shard_unit).
  Plan make_shard_plan(DType dtype, int64_t numel, int shards, int, const float*, PlanState&,
                       PlanInfo& info) const override {
    DQ_CHECK(shards >= 1 && numel % shards == 0, "shard plan: the bucket does not split into equal shards");
    const int64_t unit = identity_shard_unit(numel / shards);
    DQ_CHECK(unit > 0, "shard plan: shards of " + std::to_string(numel / shards) +
                           " elements must be padded first (padded_shard)");
    info.bits_per_coord = 8.0 * dtype_size(dtype);
    return make_identity_plan(dtype, numel, shards, int32_t(unit));
  }

 private:
  C codec_;
};

}  // namespace dynamiq
