// Mode "lossless": exponent-coded exact all-reduce (lossless_codec.h). Exact,
// so it needs no statistics and no non-finite scan (inf and nan travel
// bit-exactly); the plan is the identity plan, so its blocks are exactly mode
// "none"'s and each block is the same arithmetic on fewer bytes.
#include "kernels/lossless/lossless_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace {

class LosslessScheme final : public Scheme {
 public:
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return true; }
  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int, const float*, PlanState&,
                 PlanInfo& info) const override {
    // Wire size is data-dependent; report the raw width as the upper bound
    // (a block is never more than raw + 16 header bytes; CallStats::bytes_sent
    // has what was sent).
    info.bits_per_coord = 8.0 * dtype_size(dtype);
    return make_lossless_plan(dtype, numel, num_chunks);
  }

 private:
  LosslessCodec codec_;
};

}  // namespace

std::unique_ptr<Scheme> make_lossless_scheme(const CollectiveConfig&) {
  return std::make_unique<LosslessScheme>();
}

}  // namespace dynamiq
