#include "kernels/scheme.h"

#include "kernels/identity/identity_codec.h"

namespace dynamiq {

namespace {

class NoneScheme final : public Scheme {
 public:
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return true; }
  bool local_pass(const void*, DType, int64_t, float*) const override { return false; }
  bool device_local_pass(const Device&, const void*, DType, int64_t, float*) const override { return false; }
  std::unique_ptr<Codec> device_codec(const Device& d) const override { return d.identity_codec(); }
  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int, const float*, PlanState&,
                 PlanInfo& info) const override {
    info.bits_per_coord = 8.0 * dtype_size(dtype);
    return make_identity_plan(dtype, numel, num_chunks);
  }

 private:
  IdentityCodec codec_;
};

}  // namespace

std::unique_ptr<Scheme> make_none_scheme(const CollectiveConfig&) {
  return std::make_unique<NoneScheme>();
}

std::unique_ptr<Scheme> make_scheme(const CollectiveConfig& cfg) {
  switch (cfg.mode) {
    case Mode::kNone: return make_none_scheme(cfg);
    case Mode::kDynamiq: return make_dynamiq_scheme(cfg);
    case Mode::kLossless: return make_lossless_scheme(cfg);
    case Mode::kBitsplit: return make_bitsplit_scheme(cfg);
    default: break;
  }
  throw Error(std::string("mode '") + mode_name(cfg.mode) + "' is not available in this build");
}

}  // namespace dynamiq
