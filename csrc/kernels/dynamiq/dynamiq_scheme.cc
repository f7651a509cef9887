// The "dynamiq" scheme (DynamiQ paper sections 3.1-3.4): the local pass
// computes per-super-group mean and sum of squares; after the metadata
// all-reduce every rank runs the same allocator on the same statistics, so
// all ranks hold the same widths, order, chunks and means.
#include <cmath>
#include <cstdio>
#include <string>

#include "alloc/dynamiq_layout.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/dynamiq/dynamiq_stats.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace {

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}

DynamiqParams params_from(const ParamSet& cfg) {
  DynamiqParams p;
  p.fmt.S = int32_t(cfg.num("supergroup_size"));
  p.fmt.s = int32_t(cfg.num_or("group_size", 16));
  p.fmt.hierarchical = cfg.flag("hierarchical_scales");
  if (!(p.fmt.S > 0 && p.fmt.s > 0 && p.fmt.S % p.fmt.s == 0))
    throw Error("dynamiq: supergroup_size=" + std::to_string(p.fmt.S) + " must be a multiple of group_size (" +
                std::to_string(p.fmt.s) + ")");
  if (cfg.has("eps"))
    for (int i = 0; i < 4; ++i)
      // -1: the width's default; anything else is validated by the codec
      if (!(cfg.list("eps")[size_t(i)] < 0.0)) p.eps[size_t(i)] = float(cfg.list("eps")[size_t(i)]);
  p.uniform_levels = cfg.flag("uniform_levels");
  return p;
}

uint32_t widths_mask(const ParamSet& cfg) {
  uint32_t m = 0;
  for (double w : cfg.list("widths")) m |= 1u << int(w);
  return m;
}

class DynamiqScheme final : public Scheme {
 public:
  explicit DynamiqScheme(const ParamSet& cfg)
      : codec_(params_from(cfg)), correlated_(cfg.str("rounding") == "correlated") {
    alloc_.bits = cfg.num("bits");
    alloc_.widths_mask = widths_mask(cfg);
    alloc_.format = codec_.params().fmt;
    alloc_.solver = cfg.str("allocator") == "exact" ? AllocSolver::kExact : AllocSolver::kFast;
    // What the allocator would reject on every bucket, checked once here: the
    // widths (allowed, and each wider one strictly larger on the wire) and a
    // budget that fits a whole super-group at the narrowest width. Buckets
    // whose padded partial last super-group does not fit take the exact path
    // (fits_budget), which needs a budget that some bucket can meet.
    const WidthSet ws = dynamiq_width_set(alloc_.widths_mask, alloc_.format);
    if (!dynamiq_budget_feasible(alloc_.format.S, alloc_.bits, alloc_.widths_mask, alloc_.format))
      throw Error("dynamiq: bits=" + num(alloc_.bits) + " is below the " +
                  num(dynamiq_min_feasible_bits(alloc_.format.S, alloc_.widths_mask, alloc_.format)) +
                  " bits per coordinate of a super-group at the narrowest allowed width (" +
                  std::to_string(ws.w[0]) + " bits with its scales); raise bits or allow a narrower width");
  }
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return false; }
  void set_rng_flags(RngCtx& rng) const override { rng.correlated = correlated_; }
  int64_t min_compressed_numel() const override { return alloc_.format.S; }
  int64_t stats_count(DType, int64_t numel) const override {
    return 2 * ceil_div<int64_t>(numel, alloc_.format.S);
  }
  bool local_pass(const void* data, DType dtype, int64_t numel, float* stats) const override {
    return dynamiq_local_stats(data, dtype, numel, alloc_.format.S, stats);
  }
  bool fits_budget(int64_t numel) const override {
    // the allocator's own test (dynamiq_allocate throws exactly when it fails)
    return dynamiq_budget_feasible(numel, alloc_.bits, alloc_.widths_mask, alloc_.format);
  }
  Plan make_plan(DType dtype, int64_t numel, int num_chunks, int world, const float* global_stats,
                 PlanState& state, PlanInfo& info) const override {
    return plan_with(SgLayout::kBalancedByWidth, dtype, numel, num_chunks, world, global_stats, state, info);
  }
  int64_t shard_multiple() const override { return alloc_.format.S; }
  // Statistics and allocation over the whole bucket, as for the all-reduce;
  // the wire order reorders by width within each shard only (SgLayout::kShards).
  Plan make_shard_plan(DType dtype, int64_t numel, int shards, int world, const float* global_stats,
                       PlanState& state, PlanInfo& info) const override {
    DQ_CHECK(shards >= 1 && numel % (int64_t(shards) * alloc_.format.S) == 0,
             "dynamiq: a reduce-scatter's shards must be whole super-groups (dynamiq.padded_shard)");
    return plan_with(SgLayout::kShards, dtype, numel, shards, world, global_stats, state, info);
  }

 private:
  Plan plan_with(SgLayout layout, DType dtype, int64_t numel, int num_chunks, int world, const float* global_stats,
                 PlanState& state, PlanInfo& info) const {
    DQ_CHECK(global_stats != nullptr, "dynamiq: planning needs the all-reduced statistics");
    AllocState as;
    as.has_u = state.has_u;
    as.u = state.u;
    as.step = state.step;
    AllocResult res;
    // stats are [mean, sum of squares] per super-group: the allocator reads every second float.
    Plan plan = make_dynamiq_plan(dtype, numel, global_stats + 1, 2, alloc_, as, num_chunks, layout, &res);
    state.has_u = as.has_u;
    state.u = as.u;
    state.step = as.step;
    const int64_t nsg = plan.num_units;
    plan.bias.resize(size_t(nsg));
    const float inv = 1.0f / float(world);
    for (int64_t j = 0; j < nsg; ++j) plan.bias[size_t(j)] = global_stats[2 * j] * inv;
    for (int i = 0; i < 5; ++i) info.width_units[i] = res.width_count[i];
    info.bits_per_coord = res.bits_per_coord;
    info.alloc_passes = res.passes + res.fill_passes;
    info.alloc_fallback = res.exact_fallback;
    info.alloc_exact = res.exact_search;
    return plan;
  }

  DynamiqCodec codec_;
  bool correlated_;
  AllocParams alloc_;
};

}  // namespace

std::unique_ptr<Scheme> make_dynamiq_scheme(const ParamSet& cfg) { return std::make_unique<DynamiqScheme>(cfg); }

// Mode dynamiq's parameters (kernels/params.h): the Config fields, their checks, defaults and
// docs come from this list. Cross-field rules (the budget floor, S a multiple of s) are the
// scheme's (above).
std::vector<ParamDecl> dynamiq_params() {
  ParamDecl widths;
  widths.name = "widths";
  widths.type = ParamType::kIntegers;
  widths.def.list = {2, 4, 8};
  widths.also = {1, 2, 4, 8, 16};
  widths.doc = "the bit widths a super-group may take (16: raw bf16)";
  ParamDecl eps = unset(number_param("eps", 0, 0, 4, false,
                                     "spacing of the non-uniform levels for widths (1, 2, 4, 8); -1 keeps a "
                                     "width's default (None: 0.30 at 4 bits, 0.06 at 8; 0: evenly spaced)"));
  eps.type = ParamType::kNumbers;
  eps.size = 4;
  eps.also = {-1};
  return {
      number_param("bits", 5.0, 0.0, 16.0, true,
                   "budget in bits per coordinate, group and super-group scales included; at least the "
                   "narrowest allowed width's cost with its scales (2.5625 with the default widths and "
                   "sizes, 1.5625 with width 1)"),
      widths,
      choice_param("allocator", {"fast", "exact"},
                   "width allocation: appendix A's rule with its offset carried across steps, or section "
                   "3.2's threshold search"),
      choice_param("rounding", {"correlated", "independent"},
                   "stochastic rounding correlated across ranks (the paper's), or independent per rank"),
      unset(integer_param("group_size", 0, 1, 4096, "elements per scale group (None: 16)")),
      integer_param("supergroup_size", 256, 16, 65536,
                    "super-group size S, a multiple of group_size (the CUDA kernels need S <= 8192)"),
      eps,
      bool_param("uniform_levels", false, "ablation: evenly spaced levels"),
      bool_param("hierarchical_scales", true,
                 "uint8 group scales under a bf16 super-group scale; False sends bf16 group scales (ablation)"),
  };
}

}  // namespace dynamiq
