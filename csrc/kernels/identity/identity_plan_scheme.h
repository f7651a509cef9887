// The scheme of an exact codec without statistics over the identity plan
// (natural order, 256-element units, chunks of nearly equal unit counts):
// modes none and lossless, and exact test codecs (tests/cpp/negate_codec).
// Nothing to validate in the config and no local pass (an exact mode carries
// inf and NaN through). PlanInfo reports the raw width: for a variable-size
// codec the upper bound of a block (CallStats::bytes_sent has what was sent).
#pragma once

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

 private:
  C codec_;
};

}  // namespace dynamiq
