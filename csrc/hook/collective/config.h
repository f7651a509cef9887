// The collective's configuration as the C++ core sees it. Built from the
// validated Python `dynamiq.Config`; every field takes part in the
// fingerprint that ranks compare before each collective.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace dynamiq {

// A mode's id. The modes and their ids are listed in the codec registry
// (kernels/registry.h: mode_id("dynamiq"), mode_name(id)); the id is part of
// the wire fingerprint: never renumber.
enum class Mode : uint8_t {};
// Mode "none" (the identity codec, which is also the exact path of every
// other mode): the default.
inline constexpr Mode kModeNone = Mode(0);
// Mode "auto" (auto_mode.h): per bucket one of auto_lossy,
// lossless and none, from a cost model. Not a codec: never in the registry.
inline constexpr Mode kModeAuto = Mode(255);

// Numeric values are part of the wire fingerprint: never renumber.
// kHierarchical: ranks grouped by node (local_size per node): an intra-node
// reduce-scatter (intra_mode), an all-reduce between nodes over each local
// rank's shard (mode, ring), an intra-node all-gather (hierarchical.h).
enum class Topology : uint8_t { kRing = 0, kButterfly = 1, kTwoStep = 2, kHierarchical = 3 };
enum class ReduceOp : uint8_t { kSum = 0, kMean = 1 };
// Which collective a call runs (part of the header fingerprint): the
// all-reduce; its reduce phase alone (rank c ends with shard c of the sum);
// its all-gather phase alone (every rank ends with every rank's shard).
enum class Collective : uint8_t { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };

const char* topology_name(Topology t);
const char* collective_name(Collective c);

struct CollectiveConfig {
  Mode mode = kModeNone;
  Topology topology = Topology::kRing;
  uint64_t seed = 0;

  // Lossy modes.
  double bits = 5.0;                 // DynamiQ: budget per coordinate incl. metadata; bitsplit: width
  uint32_t widths_mask = (1u << 2) | (1u << 4) | (1u << 8);  // DynamiQ: allowed widths (bit w set)
  bool exact_allocator = false;      // DynamiQ: section 3.2 search instead of appendix A rule
  bool correlated = true;            // DynamiQ: correlated rounding across ranks
  bool stochastic = true;            // bitsplit: stochastic (true) or nearest rounding
  int32_t group_size = 0;            // 0: mode default (DynamiQ 16; bitsplit 128 or 32)
  int32_t supergroup_size = 256;     // DynamiQ super-group size S
  int32_t spike_reserve = -1;        // bitsplit: -1 auto (on for 2-3 bits), 0 off, 1 on
  bool log_scales = false;           // bitsplit: integer log scales
  // DynamiQ non-uniform level parameter per width index (1,2,4,8 -> 0..3); <0: default.
  std::array<float, 4> eps{{-1.f, -1.f, -1.f, -1.f}};
  bool uniform_levels = false;       // ablation: uniform levels
  bool hierarchical_scales = true;   // ablation: off = group scales as bf16
  // Mode bounded: exactly one is nonzero. error_bound: the absolute bound e of
  // one compression; error_bound_rel: r, e = r x the ranks' mean value range.
  double error_bound = 0.0;
  double error_bound_rel = 0.0;

  // Topology kHierarchical (hierarchical.h): ranks per node (consecutive
  // ranks share a node; 0: not given, an error there) and the mode of the
  // intra-node phases (none or lossless). In the fingerprint only for
  // kHierarchical, so the other topologies' fingerprints are unchanged.
  int32_t local_size = 0;
  Mode intra_mode = kModeNone;

  // Mode kModeAuto (auto_mode.h): the lossy candidate, and overrides of the
  // measured link (bytes/s, seconds; 0: measured). In the fingerprint only for
  // kModeAuto.
  Mode auto_lossy = Mode(1);  // dynamiq
  double auto_bandwidth = 0.0;
  double auto_latency = -1.0;  // <0: measured

  // Driver.
  // Target wire bytes per pipelined block; 0 = per path: kCompressedBlockBytes
  // for the compressed paths (kernels overlap the transfer of the next block),
  // kExactBlockBytes for the exact ones (nothing to overlap but a sum, and Gloo
  // pays a fixed cost per message: measured 0.3-1 ms on loopback).
  int64_t block_bytes = 0;
  int64_t min_compress_numel = 4096; // smaller buckets take the exact path
  int64_t window_bytes = 16 << 20;   // receive buffers posted ahead; sent buffers kept (recv_window.h, send_window.h)
  // Buckets of more bytes run as several collectives of at most this many
  // bytes, one after the other (0: never split). Bounds the working memory:
  // DDP's first step all-reduces the whole model as one bucket.
  int64_t max_collective_bytes = int64_t(256) << 20;

  static constexpr int64_t kCompressedBlockBytes = 1 << 20;
  static constexpr int64_t kExactBlockBytes = 4 << 20;
  int64_t compressed_block_bytes() const { return block_bytes > 0 ? block_bytes : kCompressedBlockBytes; }
  int64_t exact_block_bytes() const { return block_bytes > 0 ? block_bytes : kExactBlockBytes; }

  // Hash of every field above (FNV-1a over a canonical encoding).
  uint64_t fingerprint() const;
  std::string describe() const;
};

}  // namespace dynamiq
