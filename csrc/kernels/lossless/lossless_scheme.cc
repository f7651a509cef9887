// Mode "lossless": exponent-coded exact all-reduce (lossless_codec.h). Exact,
// so it needs no statistics and no non-finite scan (inf and nan travel
// bit-exactly); the plan is the identity plan, so its blocks are exactly mode
// "none"'s and each block is the same arithmetic on fewer bytes.
#include <string>

#include "kernels/identity/identity_codec.h"
#include "kernels/lossless/lossless_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace {

class LosslessScheme final : public Scheme {
 public:
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return true; }
  bool local_pass(const void*, DType, int64_t, float*) const override { return false; }
  bool device_local_pass(const Device&, const void*, DType, int64_t, float*) const override { return false; }
  std::unique_ptr<Codec> device_codec(const Device& d) const override { return d.lossless_codec(codec_.options()); }
  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int, const float*, PlanState&,
                 PlanInfo& info) const override {
    // Wire size is data-dependent; report the raw width as the upper bound
    // (a block is never more than raw + 16 header bytes; CallStats::bytes_sent
    // has what was sent).
    info.bits_per_coord = 8.0 * dtype_size(dtype);
    return make_lossless_plan(dtype, numel, num_chunks);
  }
  // Its plan is an identity plan: any unit works, so one that divides the shard.
  Plan make_shard_plan(DType dtype, int64_t numel, int shards, int, const float*, PlanState&,
                       PlanInfo& info) const override {
    DQ_CHECK(shards >= 1 && numel % shards == 0, "lossless: the bucket does not split into equal shards");
    const int64_t unit = identity_shard_unit(numel / shards);
    DQ_CHECK(unit > 0, "lossless: shards of " + std::to_string(numel / shards) +
                           " elements must be padded (dynamiq.padded_shard)");
    info.bits_per_coord = 8.0 * dtype_size(dtype);
    return make_identity_plan(dtype, numel, shards, int32_t(unit));
  }

 private:
  LosslessCodec codec_;
};

}  // namespace

std::unique_ptr<Scheme> make_lossless_scheme(const CollectiveConfig&) {
  return std::make_unique<LosslessScheme>();
}

}  // namespace dynamiq
