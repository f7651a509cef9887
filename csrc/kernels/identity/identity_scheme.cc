// Mode "none": the identity codec in natural order, no statistics. The
// driver runs it as its exact path (Scheme::identity), so its buckets never
// reach make_plan through the compressed path; the plan is the exact path's.
#include "kernels/identity/identity_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace {

class IdentityScheme final : public Scheme {
 public:
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return true; }
  bool identity() const override { return true; }
  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int, const float*, PlanState&,
                 PlanInfo& info) const override {
    info.bits_per_coord = 8.0 * dtype_size(dtype);
    return make_identity_plan(dtype, numel, num_chunks);
  }

 private:
  IdentityCodec codec_;
};

}  // namespace

std::unique_ptr<Scheme> make_identity_scheme(const CollectiveConfig&) { return std::make_unique<IdentityScheme>(); }

}  // namespace dynamiq
