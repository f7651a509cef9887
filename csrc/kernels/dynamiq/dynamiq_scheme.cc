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

DynamiqParams params_from(const CollectiveConfig& cfg) {
  DynamiqParams p;
  p.fmt.S = cfg.supergroup_size;
  p.fmt.s = cfg.group_size > 0 ? cfg.group_size : 16;
  p.fmt.hierarchical = cfg.hierarchical_scales;
  DQ_CHECK(p.fmt.S > 0 && p.fmt.s > 0 && p.fmt.S % p.fmt.s == 0,
           "dynamiq: supergroup_size must be a positive multiple of group_size");
  for (int i = 0; i < 4; ++i)
    // negative: the default; anything else (NaN included) is validated by the codec
    if (!(cfg.eps[size_t(i)] < 0.f)) p.eps[size_t(i)] = cfg.eps[size_t(i)];
  p.uniform_levels = cfg.uniform_levels;
  return p;
}

class DynamiqScheme final : public Scheme {
 public:
  explicit DynamiqScheme(const CollectiveConfig& cfg) : codec_(params_from(cfg)) {
    alloc_.bits = cfg.bits;
    alloc_.widths_mask = cfg.widths_mask;
    alloc_.format = codec_.params().fmt;
    alloc_.solver = cfg.exact_allocator ? AllocSolver::kExact : AllocSolver::kFast;
    // What the allocator would reject on every bucket, checked once here: the
    // widths (allowed, and each wider one strictly larger on the wire) and a
    // budget that fits a whole super-group at the narrowest width. Buckets
    // whose padded partial last super-group does not fit take the exact path
    // (fits_budget), which needs a budget that some bucket can meet.
    const WidthSet ws = dynamiq_width_set(alloc_.widths_mask, alloc_.format);
    if (!(std::isfinite(cfg.bits) && cfg.bits > 0.0))
      throw Error("dynamiq: bits must be a finite positive number (budget per coordinate), got " +
                  num(cfg.bits));
    if (!dynamiq_budget_feasible(alloc_.format.S, alloc_.bits, alloc_.widths_mask, alloc_.format))
      throw Error("dynamiq: bits=" + num(cfg.bits) + " is below the " +
                  num(dynamiq_min_feasible_bits(alloc_.format.S, alloc_.widths_mask, alloc_.format)) +
                  " bits per coordinate of a super-group at the narrowest allowed width (" +
                  std::to_string(ws.w[0]) + " bits with its scales); raise bits or allow a narrower width");
  }
  const Codec& codec() const override { return codec_; }
  bool exact() const override { return false; }
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
  AllocParams alloc_;
};

}  // namespace

std::unique_ptr<Scheme> make_dynamiq_scheme(const CollectiveConfig& cfg) {
  return std::make_unique<DynamiqScheme>(cfg);
}

}  // namespace dynamiq
