// A Scheme is one compression mode as the driver sees it: an optional local
// statistics pass (whose output is all-reduced), a planner, and a codec. Each
// codec folder defines its scheme in <codec>_scheme.cc; the registry
// (registry.h) makes them.
#pragma once

#include <memory>

#include "kernels/base/nonfinite.h"
#include "kernels/codec.h"
#include "kernels/device.h"
#include "kernels/params.h"

namespace dynamiq {

// Allocator state carried across steps per bucket (appendix A's offset u).
struct PlanState {
  bool has_u = false;
  double u = 0.0;
  double step = 0.0;  // the fast solver's bracketing step (csrc/alloc AllocState)
};

// What the planner decided, for the hook's per-step statistics.
struct PlanInfo {
  // dynamiq: super-groups per width, index 0..4 for widths 1, 2, 4, 8, 16
  // (other modes leave it 0).
  int64_t width_units[5] = {0, 0, 0, 0, 0};
  // Wire bits per coordinate of one full copy of the bucket (all metadata included).
  double bits_per_coord = 0.0;
  // Allocator (dynamiq mode): its cost evaluations (AllocResult::passes +
  // fill_passes), whether it searched exactly (AllocResult::exact_search) and
  // whether that was the fast solver's fallback (AllocResult::exact_fallback).
  int64_t alloc_passes = 0;
  bool alloc_exact = false;
  bool alloc_fallback = false;
};

class Scheme {
 public:
  virtual ~Scheme() = default;
  virtual const Codec& codec() const = 0;
  // True for modes whose result is exact (none, lossless): non-finite values
  // pass through them unchanged, so no fallback is needed.
  virtual bool exact() const = 0;
  // True for the scheme whose all-reduce is the driver's exact path itself
  // (mode none: the identity codec in natural order). The driver then takes
  // that path (Path::kExactMode) and skips the local pass.
  virtual bool identity() const { return false; }
  // Number of floats of per-bucket statistics to all-reduce before planning.
  virtual int64_t stats_count(DType dtype, int64_t numel) const {
    (void)dtype, (void)numel;
    return 0;
  }
  // One local pass over the bucket: fills `stats` (stats_count floats) and
  // returns true if the bucket holds a non-finite value. A scheme with
  // statistics overrides it; the default has none and runs the non-finite
  // scan (has_nonfinite) for a lossy scheme, nothing for an exact one.
  virtual bool local_pass(const void* data, DType dtype, int64_t numel, float* stats) const;
  // The same on a device's data (stats still written to host memory): the
  // device local pass registered for the mode (kernels/registry.h) when the
  // scheme has statistics, else Device::has_nonfinite for a lossy scheme.
  bool device_local_pass(const Device& d, const void* data, DType dtype, int64_t numel, float* stats) const;
  // The device's version of codec(): the device codec factory registered for
  // the mode and d.name(). Throws Error if there is none.
  std::unique_ptr<Codec> device_codec(const Device& d) const;
  // False if no plan of a bucket of `numel` elements fits the scheme's wire
  // budget (mode dynamiq: a partial last super-group is padded to S on the
  // wire, so for some sizes even the narrowest widths exceed bits * numel).
  // The driver then sends the bucket exactly (Path::kExactBudget) instead of
  // planning. Depends only on numel and the config, so every rank agrees.
  virtual bool fits_budget(int64_t numel) const {
    (void)numel;
    return true;
  }
  // The plan, identical on every rank given identical inputs.
  virtual Plan make_plan(DType dtype, int64_t numel, int num_chunks, int world,
                         const float* global_stats, PlanState& state, PlanInfo& info) const = 0;

  // Reduce-scatter and all-gather: the bucket is `shards` equal shards and
  // chunk c of the plan must be exactly shard c (rank c decodes its shard from
  // what it receives, never from a unit shared with a neighbour's shard).
  // shard_multiple(): what every shard's element count must be a multiple of
  // for that (a DynamiQ super-group, a bit-split unit); 0 for the schemes whose
  // plan is an identity plan, whose unit any shard size fits
  // (identity_shard_unit).
  virtual int64_t shard_multiple() const { return 0; }
  // That plan. The default: make_plan's plan for `shards` chunks, checked to
  // cut exactly at the shards (Error otherwise).
  virtual Plan make_shard_plan(DType dtype, int64_t numel, int shards, int world, const float* global_stats,
                               PlanState& state, PlanInfo& info) const;

  // The randomness flags of the scheme's rounding (RngCtx::correlated, ::stochastic), from its
  // parameters: the driver starts from RngCtx's defaults and lets the scheme set its own.
  virtual void set_rng_flags(RngCtx& rng) const { (void)rng; }
  // Buckets of fewer elements take the exact path whatever min_compress_numel says (dynamiq: one
  // super-group; the others: 256, the floor every mode had before modes had parameters).
  virtual int64_t min_compressed_numel() const { return 256; }

  // The registry id of the mode this scheme was made for (make_scheme sets it).
  Mode mode() const { return mode_; }

 private:
  friend std::unique_ptr<Scheme> make_scheme(Mode mode, const ParamSet& given);
  Mode mode_ = kModeNone;
};

// The unit of an identity plan whose chunks are shards of `shard` elements:
// the largest divisor of `shard` in [64, 256], else the shard itself up to
// 4096 elements (one unit per chunk), else 0 (the shard must be padded). 256
// for an empty shard.
int64_t identity_shard_unit(int64_t shard);

// Schemes are made by make_scheme (kernels/registry.h), from the factory a
// mode registers there.

}  // namespace dynamiq
