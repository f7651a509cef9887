// The "bitsplit" scheme: no statistics, a natural-order plan, the bit-split
// codec. Lossy, so its local pass (Scheme's default: the non-finite scan)
// reports non-finite input and the driver sends such a bucket exactly
// (inf/nan must reach GradScaler).
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace {

class BitsplitScheme final : public Scheme {
 public:
  explicit BitsplitScheme(const BitsplitParams& p) : codec_(p) {}
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return false; }
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
