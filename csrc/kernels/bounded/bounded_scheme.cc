// Mode "bounded": the error-bounded codec over the identity plan. With an
// absolute bound (error_bound = e) it needs no statistics: the default local
// pass scans for inf and NaN and such a bucket takes the exact path. With a
// relative bound (error_bound_rel = r) the local pass also reports the
// rank's value range max - min (finite values) as one statistic; after the
// metadata all-reduce every rank holds the same sum of ranges, and the plan
// takes e = r x (sum of ranges) / world, the mean range of the ranks'
// buckets: the same float on every rank.
#include <cmath>
#include <limits>

#include "kernels/bounded/bounded_codec.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace {

class BoundedScheme final : public Scheme {
 public:
  BoundedScheme(double abs, double rel) : abs_(abs), rel_(rel) {}
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return false; }
  int64_t stats_count(DType, int64_t) const override { return rel_ > 0.0 ? 1 : 0; }

  bool local_pass(const void* data, DType dtype, int64_t numel, float* stats) const override {
    if (rel_ <= 0.0) return Scheme::local_pass(data, dtype, numel, stats);
    bool nonfinite = false;
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    DQ_DISPATCH_DTYPE(dtype, T, [&] {
      using Tr = DTypeTraits<T>;
      const auto* p = static_cast<const typename Tr::storage*>(data);
      for (int64_t i = 0; i < numel; ++i) {
        if (Tr::nonfinite(p[i])) {
          nonfinite = true;
          continue;
        }
        const float v = Tr::load(p, i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
    });
    const double range = hi >= lo ? double(hi) - double(lo) : 0.0;
    stats[0] = range > double(std::numeric_limits<float>::max()) ? std::numeric_limits<float>::max() : float(range);
    return nonfinite;
  }

  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int world, const float* stats, PlanState&,
                 PlanInfo& info) const override {
    Plan p = make_identity_plan(dtype, numel, num_chunks);
    finish(p, world, stats, info);
    return p;
  }

  Plan make_shard_plan(DType dtype, int64_t numel, int shards, int world, const float* stats, PlanState&,
                       PlanInfo& info) const override {
    DQ_CHECK(shards >= 1 && numel % shards == 0, "shard plan: the bucket does not split into equal shards");
    const int64_t unit = identity_shard_unit(numel / shards);
    DQ_CHECK(unit > 0, "shard plan: shards of " + std::to_string(numel / shards) +
                           " elements must be padded first (padded_shard)");
    Plan p = make_identity_plan(dtype, numel, shards, int32_t(unit));
    finish(p, world, stats, info);
    return p;
  }

  // The absolute bound of this collective (same inputs on every rank, same
  // float): the requested one rounded down to float32.
  float resolve(int world, const float* stats) const {
    double e = abs_;
    if (rel_ > 0.0) {
      const double sum = stats ? double(stats[0]) : 0.0;
      e = std::isfinite(sum) && sum > 0.0 && world > 0 ? rel_ * sum / double(world) : 0.0;
    }
    if (!(e > 0.0)) return 0.0f;
    if (e > double(kBoundedMaxBound)) return kBoundedMaxBound;
    float f = float(e);  // rounded down, so the bound kept is never looser than asked
    if (double(f) > e) f = std::nextafter(f, 0.0f);
    return f;
  }

 private:
  void finish(Plan& p, int world, const float* stats, PlanInfo& info) const {
    p.error_bound = resolve(world, stats);
    // A variable-size codec: the plan reports the upper bound of a message
    // (every code block raw), CallStats::bytes_sent what was sent.
    info.bits_per_coord = p.numel > 0 ? 8.0 *
        double(bounded_static_bytes_for(p.numel, p.unit) + bounded_max_dynamic_bytes_for(p.numel, p.unit)) /
        double(p.numel) : 0.0;
  }

  double abs_, rel_;
  BoundedCodec codec_;
};

}  // namespace

std::unique_ptr<Scheme> make_bounded_scheme(const ParamSet& cfg) {
  const bool has_a = cfg.has("error_bound"), has_r = cfg.has("error_bound_rel");
  if (has_a == has_r)
    throw Error("mode='bounded' needs exactly one of error_bound (absolute) and error_bound_rel (relative to "
                "the value range)");
  return std::make_unique<BoundedScheme>(cfg.num_or("error_bound", 0.0), cfg.num_or("error_bound_rel", 0.0));
}

// Mode bounded's parameters (kernels/params.h): exactly one of the two is given (the factory
// above checks it).
std::vector<ParamDecl> bounded_params() {
  return {
      unset(number_param("error_bound", 0, 0, double(kBoundedMaxBound), true,
                         "the absolute error bound e of one compression (rounded down to float32); a sum "
                         "over n ranks is within n x e of the exact sum")),
      unset(number_param("error_bound_rel", 0, 0, 1, true,
                         "a bound relative to the bucket's value range: e = error_bound_rel x the mean over "
                         "ranks of each rank's max - min")),
  };
}

}  // namespace dynamiq
