// One all-reduce of a bucket, end to end (docs/architecture.md "The data path of one all-reduce"):
//   1. local pass: the scheme's statistics and the non-finite flag;
//   2. header exchange (header_exchange.h): an int64 all-reduce carrying the
//      fingerprint of everything the ranks must agree on (config, dtype, numel,
//      op, sequence number), the non-finite count and input-error reports, so
//      every rank takes the same decision and raises the same error;
//   3. metadata all-reduce of the statistics (over the identity codec and the
//      same topology, so every rank gets bit-identical statistics);
//   4. plan, blocks, schedule; 5. execute; 6. the codec's decompress writes the
//      final values (bias added back, divided for mean) into the bucket.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hook/collective/config.h"
#include "hook/collective/exec_stats.h"
#include "hook/collective/timeline.h"
#include "hook/collective/topology.h"
#include "kernels/registry.h"
#include "hook/transport/transport.h"

namespace dynamiq {

struct AutoState;  // auto_mode.h

// Mode auto's part of one header exchange (auto_mode.h): this rank's numbers
// in, their sums over the ranks out; the fingerprint of the auto config is
// compared like the other fields.
struct AutoExchange {
  std::vector<int64_t> local;
  std::vector<int64_t> sums;
  uint64_t fingerprint = 0;
};

// Which path a bucket took. Values are reported to Python: never renumber.
enum class Path : int32_t {
  kCompressed = 0,
  kExactMode = 1,       // mode none (Scheme::identity) or a world of one rank
  kExactTiny = 2,       // too small for compression to pay
  kExactNonfinite = 3,  // some rank had inf/nan: exact path so they reach the optimizer
  kExactBudget = 4,     // no plan fits the bit budget at this size (Scheme::fits_budget)
  kMixed = 5,           // a sliced bucket (max_collective_bytes) whose slices took different paths
};

// Input problems a rank reports instead of taking part, so that its peers
// raise at once instead of waiting for a timeout. Never renumber.
enum class InputError : int32_t {
  kNone = 0,
  kDType = 1,
  kLayout = 2,   // sparse or non-contiguous
  kDevice = 3,
  kOther = 4,
  kConfig = 5,   // make_scheme rejected this rank's config (set by the driver itself)
  kLocalPass = 6,  // the local pass (statistics, non-finite scan) failed on this rank (set by the driver)
  kShape = 7,    // reduce-scatter / all-gather: output and input sizes or dtypes that do not fit
};
constexpr int kNumInputErrors = 8;

// A bucket's local pass (statistics and non-finite flag) run ahead of its
// collective (precompute_local_pass), e.g. while the previous bucket is on
// the wire. Used by the call whose config fingerprint, data, dtype and numel
// it was made for; any other call (a slice of a bucket) runs its own.
struct PrecomputedLocalPass {
  uint64_t fingerprint = 0;
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t numel = 0;
  std::vector<float> stats;
  bool nonfinite = false;
};

struct CallArgs {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t numel = 0;
  ReduceOp op = ReduceOp::kSum;
  uint64_t seq = 0;               // collective sequence number (randomness key, fingerprint)
  PlanState* plan_state = nullptr;  // allocator state of this bucket (may be null)
  InputError local_error = InputError::kNone;
  // Non-null: `data` lives in this device's memory; the local pass, the
  // metadata and exact all-reduces and the codec run there (buffers in its
  // memory); the header exchange, allocator and plan stay on the host.
  const Device* device = nullptr;
  // Optional owner of `data` (a tensor). After a failure the backend may still
  // write into receives posted into `data` (exact paths receive the result
  // there); the driver then keeps this owner alive until the process exits
  // (see keep_forever) instead of letting the memory be freed and reused.
  std::shared_ptr<void> keep_alive;
  // The collective (config.h Collective); an all-reduce works in place on `data`.
  //  - kReduceScatter: `data` (numel elements) is world equal shards and is
  //    only read; `output` (numel / world elements, same dtype and memory)
  //    receives this rank's shard of the reduction.
  //  - kAllGather: `data` (numel elements) is world equal shards, this rank's
  //    filled in by the caller; every other shard is written (op ignored).
  // Shards must be cut by the plan (padded_shard); the caller stages others.
  Collective kind = Collective::kAllReduce;
  void* output = nullptr;
  // The element count the caller was given before staging (padded_shard):
  // in the header fingerprint instead of numel, so that ranks whose tensors
  // differ in size are told so even when their padded sizes agree. <0: numel.
  int64_t caller_numel = -1;
  // Non-null: the call's phases and every kernel, send and receive of its
  // executor runs are appended there (timeline.h). Not part of the header
  // fingerprint: ranks may differ, and nothing on the wire changes.
  Timeline* timeline = nullptr;
  // Non-null: this bucket's local pass, run earlier (see PrecomputedLocalPass).
  const PrecomputedLocalPass* local_pass = nullptr;
  // kMean divides by this many ranks (0: the transport's size). The
  // hierarchical topology's inter-node all-reduce divides by the whole world.
  int32_t mean_world = 0;
  // Mode auto: the group's state (measured link, codec costs; null: a fresh
  // one, so the bucket runs mode none), and the driver's header extension.
  AutoState* auto_state = nullptr;
  AutoExchange* auto_exchange = nullptr;
};

// Runs the local pass of an all-reduce of `args` under `cfg` now (host
// memory only), for a later call with the same config and bucket. Returns
// false (nothing to precompute: mode none, a config make_scheme rejects,
// a device bucket, or a local pass that failed, which the call then runs and
// reports itself).
bool precompute_local_pass(const CollectiveConfig& cfg, const CallArgs& args, PrecomputedLocalPass& out);

// The main all-reduce's executor counts and times, this rank (ExecStats:
// bytes_sent, bytes_received, messages_sent, t_kernel, t_wait, t_post), and the
// driver's own.
struct CallStats : ExecStats {
  Path path = Path::kCompressed;
  int64_t numel = 0;
  int64_t meta_bytes_sent = 0;  // statistics all-reduce, this rank
  double bits_per_coord = 0.0;  // wire bits per coordinate of one full copy of the bucket
  int64_t width_units[5] = {0, 0, 0, 0, 0};  // dynamiq: super-groups per width 1/2/4/8/16 (other modes: 0)
  int64_t blocks = 0;
  double t_local = 0.0, t_header = 0.0, t_meta = 0.0, t_plan = 0.0, t_total = 0.0;
  int64_t pool_bytes = 0;  // message buffers the calling thread keeps after the call (executor_pool_bytes)
  int64_t slices = 1;      // collectives the bucket ran as (CollectiveConfig::max_collective_bytes)
  bool has_u = false;
  double u = 0.0;       // allocator state after this call (carry to the next step)
  double u_step = 0.0;
  // Allocator work (dynamiq mode; summed over slices): its cost evaluations
  // (fast: passes over the statistics; exact search: bisection steps; plus the
  // tie fill's passes), slices whose widths came from an exact search (a
  // first step, AllocSolver::kExact, or a fallback; not a budget that fits
  // every SG at the widest width), of those the fast solver's fallbacks (the
  // statistics moved too far since the last step: AllocResult::exact_fallback).
  int64_t alloc_passes = 0;
  int64_t alloc_exact = 0;
  int64_t alloc_fallbacks = 0;
  // Topology hierarchical (hierarchical.h): bytes this rank sent in the
  // inter-node all-reduce, and the phases' times (reduce-scatter and
  // all-gather inside the node, all-reduce between nodes).
  int64_t inter_bytes_sent = 0;
  double t_intra = 0.0, t_inter = 0.0;
  // Mode auto: the mode this bucket ran in (-1: not auto) and the cost
  // model's predicted seconds for none, lossless and the lossy mode.
  int32_t auto_choice = -1;
  double auto_predicted[3] = {0.0, 0.0, 0.0};
  bool auto_reprobe = false;  // the choice re-probed a mode that had not run for a while
};

// Runs the collective in place on args.data. Throws Error (same message on
// every rank for config disagreement and reported input errors; a rank whose
// config make_scheme rejects still takes part in the header exchange,
// reporting InputError::kConfig, and then raises make_scheme's message while
// its peers raise the common one). A bucket of
// more than cfg.max_collective_bytes runs as that many equal slices (multiples
// of 4096 elements), each a whole collective of its own (header, statistics,
// plan, randomness key make_rng_key(seed, seq, slice), the bucket's PlanState
// carried from one slice to the next); the stats add up over the slices (path:
// exact-nonfinite if any slice took it; bits_per_coord: the numel-weighted mean).
CallStats all_reduce(Transport& tr, const CollectiveConfig& cfg, const CallArgs& args);

// Runs args.kind: the all-reduce (all_reduce above), or a reduce-scatter or
// all-gather as one collective (never sliced: max_collective_bytes does not
// apply). Same header exchange, errors and statistics; a reduce-scatter runs
// the all-reduce's paths (compressed, exact for mode none, tiny, non-finite
// or budget) over the topology's reduce phase, an all-gather (modes none and
// lossless only: an error on every rank otherwise) its all-gather phase. A
// rank whose numel is not a multiple of the world size reports
// InputError::kShape.
CallStats collective(Transport& tr, const CollectiveConfig& cfg, const CallArgs& args);

// The shard size a reduce-scatter or all-gather of `world` shards of `shard`
// elements each runs with (>= shard): `shard` itself when the plan can cut
// the bucket at the shards (chunk c = shard c exactly), else a size the
// caller pads each shard to with zeros (a multiple of the mode's unit and of
// 64). Depends only on the config, kind, world and shard, so every rank
// agrees. Throws Error for a config make_scheme rejects.
int64_t padded_shard(const CollectiveConfig& cfg, Collective kind, int world, int64_t shard);

// The sum of a float32 vector in host memory over ranks with the identity
// codec (the metadata all-reduce): exact float32 ring/butterfly/two-step sums,
// bit-identical on every rank. With a device, staged through a buffer in its
// memory and summed there.
void all_reduce_exact_f32(Transport& tr, Topology topo, float* data, int64_t count,
                          int64_t block_bytes, int64_t window_bytes, int64_t* bytes_sent,
                          const Device* device = nullptr, Timeline* timeline = nullptr, int32_t slice = 0);

// The topology of the metadata all-reduce for a collective on `data_topology`:
// two-step instead of a ring of 4 or more ranks (the statistics are small, so
// the number of rounds sets their cost: 2(n-1) on a ring, 2 on two-step with
// NCCL's posting, tests/cpp/test_rounds.cc; over Gloo on 4 ranks, 1 MB buckets,
// two-step was also a little faster and a butterfly a little slower than the
// ring: experiments/results/nccl_order/), else the data topology.
Topology metadata_topology(Topology data_topology, int world);

// How many device codecs the driver keeps made (one per config, mode, device
// and stream, at most 16: their tables are uploaded once, not per collective).
size_t device_codecs_cached();
// Drops the cached device codecs made for `stream` (their device memory is
// freed on it): before the stream is destroyed.
void release_device_codecs(const void* stream);
// Drops every cached device codec (tests: a clean count of device calls).
void clear_device_codecs();

}  // namespace dynamiq
