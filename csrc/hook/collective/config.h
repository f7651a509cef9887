// The collective's configuration as the C++ core sees it. Built from the
// validated Python `dynamiq.Config`; every field takes part in the
// fingerprint that ranks compare before each collective.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/params.h"

namespace dynamiq {

// A topology's id. The topologies and their ids are listed in the topology
// registry (topology.h: topology_id("butterfly"), topology_name(id)); the id
// is part of the wire fingerprint: never renumber. Built in: ring 0,
// butterfly 1, twostep 2 (schedules), hierarchical 3 (a composition).
enum class Topology : uint8_t {};
// Topology "ring": the default, and the schedule the hierarchical phases run.
inline constexpr Topology kTopologyRing = Topology(0);
// Topology "hierarchical" (hierarchical.h): a composition of collectives over
// sub-groups, not a schedule; ranks grouped by node (local_size per node).
inline constexpr Topology kTopologyHierarchical = Topology(3);
enum class ReduceOp : uint8_t { kSum = 0, kMean = 1 };
// Which collective a call runs (part of the header fingerprint): the
// all-reduce; its reduce phase alone (rank c ends with shard c of the sum);
// its all-gather phase alone (every rank ends with every rank's shard).
enum class Collective : uint8_t { kAllReduce = 0, kReduceScatter = 1, kAllGather = 2 };

const char* collective_name(Collective c);

struct CollectiveConfig {
  Mode mode = kModeNone;
  Topology topology = kTopologyRing;
  uint64_t seed = 0;

  // The codec's parameters (bits, rounding, error_bound, ...), as each codec declares them in
  // its folder (kernels/params.h, registered with the mode: registry.h). For mode auto, those
  // of auto_lossy. Given ones only, or resolved (every default filled in: make_scheme does it).
  ParamSet params;

  // Topology hierarchical (hierarchical.h): ranks per node (consecutive
  // ranks share a node; 0: not given, an error there) and the mode of the
  // intra-node phases (none or lossless). In the fingerprint only for
  // hierarchical, so the other topologies' fingerprints are unchanged.
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

  // The mode whose parameters `params` are: auto_lossy for mode auto, else mode.
  Mode codec_mode() const { return mode == kModeAuto ? auto_lossy : mode; }

  // Hash of every field above and of every declared parameter that says so (FNV-1a over a
  // canonical encoding; config.cc).
  uint64_t fingerprint() const;
  std::string describe() const;
};

class Scheme;
// make_scheme(cfg.mode, cfg.params) (kernels/registry.h); mode auto is refused (the driver makes
// its candidates' schemes).
std::unique_ptr<Scheme> make_scheme(const CollectiveConfig& cfg);

}  // namespace dynamiq
