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
  BitsplitScheme(const BitsplitParams& p, bool stochastic) : codec_(p), stochastic_(stochastic) {}
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return false; }
  void set_rng_flags(RngCtx& rng) const override { rng.stochastic = stochastic_; }
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
  bool stochastic_;
};

}  // namespace

std::unique_ptr<Scheme> make_bitsplit_scheme(const ParamSet& cfg) {
  const int spikes = cfg.has("spike_reserve") ? int(cfg.flag("spike_reserve")) : -1;
  return std::make_unique<BitsplitScheme>(
      resolve_bitsplit_params(cfg.num("bits"), int(cfg.num_or("group_size", 0)), spikes, cfg.flag("log_scales")),
      cfg.str("rounding") == "stochastic");
}

// Mode bitsplit's parameters (kernels/params.h): the Config fields, their checks, defaults and
// docs come from this list; group sizes the codec supports are checked by resolve_bitsplit_params.
std::vector<ParamDecl> bitsplit_params() {
  ParamDecl bits = number_param("bits", 4, 2, 8, false,
                                "code width; the wire carries more (group scales and zeros, and at 2-3 bits "
                                "the reserved spikes)");
  bits.integral = true;
  ParamDecl spikes = unset(bool_param("spike_reserve", false,
                                      "keep each group's min and max exactly (None: on for 2 and 3 bits)"));
  return {
      bits,
      choice_param("rounding", {"stochastic", "nearest"}, "stochastic (unbiased) or round-to-nearest codes"),
      unset(integer_param("group_size", 0, 32, 256,
                          "elements per group, a multiple of 32 (None: 128 for 5-8 bits, 32 for 2-4)")),
      spikes,
      bool_param("log_scales", false, "integer log2 group scales (theta = 10)"),
  };
}

}  // namespace dynamiq
