// A Scheme is one compression mode as the driver sees it: an optional local
// statistics pass (whose output is all-reduced), a planner, and a codec.
#pragma once

#include <memory>

#include "kernels/codec.h"
#include "kernels/device.h"
#include "hook/collective/config.h"

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
  // Number of floats of per-bucket statistics to all-reduce before planning.
  virtual int64_t stats_count(DType dtype, int64_t numel) const {
    (void)dtype, (void)numel;
    return 0;
  }
  // One local pass over the bucket: fills `stats` (stats_count floats) and
  // returns true if the bucket holds a non-finite value. Exact schemes may
  // skip the scan and return false.
  virtual bool local_pass(const void* data, DType dtype, int64_t numel, float* stats) const = 0;
  // The same on a device's data (stats still written to host memory), and the
  // device's version of codec().
  virtual bool device_local_pass(const Device& d, const void* data, DType dtype, int64_t numel,
                                 float* stats) const = 0;
  virtual std::unique_ptr<Codec> device_codec(const Device& d) const = 0;
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
};

// The unit of an identity plan whose chunks are shards of `shard` elements:
// the largest divisor of `shard` in [64, 256], else the shard itself up to
// 4096 elements (one unit per chunk), else 0 (the shard must be padded). 256
// for an empty shard.
int64_t identity_shard_unit(int64_t shard);

// The exact (uncompressed) scheme: identity codec, natural order.
std::unique_ptr<Scheme> make_none_scheme(const CollectiveConfig& cfg);

// Mode "dynamiq": variable-width non-uniform quantisation (scheme_dynamiq.cc).
std::unique_ptr<Scheme> make_dynamiq_scheme(const CollectiveConfig& cfg);

// Mode "lossless": exponent-coded, bit-identical to none (scheme_lossless.cc).
std::unique_ptr<Scheme> make_lossless_scheme(const CollectiveConfig& cfg);
// Mode "bitsplit": INT2-INT8 bit-split group quantisation (scheme_bitsplit.cc).
std::unique_ptr<Scheme> make_bitsplit_scheme(const CollectiveConfig& cfg);

// Factory for cfg.mode. Throws Error for a mode this build does not provide
// and for a config the mode rejects (group sizes, eps, widths, bits, ...):
// everything that would otherwise fail later, inside planning or a codec, is
// checked here, so a config it accepts never fails inside a collective for
// its own sake (the Python binding validate_config calls it).
std::unique_ptr<Scheme> make_scheme(const CollectiveConfig& cfg);

// True if any element of the bucket is inf or nan.
bool has_nonfinite(const void* data, DType dtype, int64_t numel);

}  // namespace dynamiq
