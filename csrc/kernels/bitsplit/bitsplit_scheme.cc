// The "bitsplit" scheme: no statistics, a natural-order plan, the bit-split
// codec. Lossy, so its local pass reports non-finite input and the driver
// sends such a bucket exactly (inf/nan must reach GradScaler).
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace {

class BitsplitScheme final : public Scheme {
 public:
  explicit BitsplitScheme(const BitsplitParams& p) : codec_(p) {}
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return false; }
  bool local_pass(const void* data, DType dtype, int64_t numel, float*) const override {
    return has_nonfinite(data, dtype, numel);
  }
  bool device_local_pass(const Device& d, const void* data, DType dtype, int64_t numel, float*) const override {
    return d.has_nonfinite(data, dtype, numel);
  }
  std::unique_ptr<Codec> device_codec(const Device& d) const override { return d.bitsplit_codec(codec_.params()); }
  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int, const float*, PlanState&,
                 PlanInfo& info) const override {
    Plan p = codec_.make_plan(dtype, numel, num_chunks);
    info.bits_per_coord =
        numel > 0 ? 8.0 * double(p.wire_offset.back()) / double(numel) : 0.0;
    return p;
  }
  int64_t shard_multiple() const override { return codec_.unit(); }

 private:
  BitsplitCodec codec_;
};

}  // namespace

std::unique_ptr<Scheme> make_bitsplit_scheme(const CollectiveConfig& cfg) {
  return std::make_unique<BitsplitScheme>(
      resolve_bitsplit_params(cfg.bits, cfg.group_size, cfg.spike_reserve, cfg.log_scales));
}

}  // namespace dynamiq
