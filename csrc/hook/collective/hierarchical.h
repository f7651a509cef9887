// Topology "hierarchical": ranks grouped by node, local_size consecutive ranks
// per node (node = rank / local_size, local rank = rank % local_size), as
// torchrun numbers them. One all-reduce of a bucket is
//   1. a header exchange over all ranks (config and ranks per node, input
//      errors), so that every rank raises the same error before any phase;
//   2. inside each node, a reduce-scatter in cfg.intra_mode (none or
//      lossless: exact) over a ring of the node's ranks: local rank j ends
//      with shard j of the node's sum (the bucket zero-padded to local_size
//      equal shards, padded_shard);
//   3. between nodes, local rank j of every node all-reduces shard j in
//      cfg.mode over a ring of the nodes (one ring per local rank, all at
//      once, so every rank's inter-node link carries 1/local_size of the
//      bucket): the lossy error is that of one compressed all-reduce over the
//      number of nodes;
//   4. inside each node, an all-gather of the shards in cfg.intra_mode.
// Phases 2-4 are the existing collectives over SubTransport views, each with
// its own header exchange inside its group. The all-gather sends the bytes
// of each finished shard unchanged, so every rank ends with the same values.
#pragma once

#include "hook/collective/collective.h"

namespace dynamiq {

// cfg.topology must be hierarchical (kTopologyHierarchical) and a.kind kAllReduce;
// the topology registry's entry for "hierarchical" composes with it (topology.h).
CallStats hierarchical_all_reduce(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a);

// The config of each phase: the intra-node phases (intra_mode, ring) and the
// inter-node all-reduce of local rank `local` (mode, ring, the seed mixed with
// `local` so that the rings draw independent rounding).
CollectiveConfig hierarchical_intra_config(const CollectiveConfig& cfg);
CollectiveConfig hierarchical_inter_config(const CollectiveConfig& cfg, int local);

// "" or why every rank of a group of `world` ranks refuses cfg at its first all-reduce: no ranks
// per node (local_size 0), a local_size that does not divide the world, a lossy intra_mode, an
// inter-node config the codec rejects. Also asked up front (Python: config.run_problem).
std::string hierarchical_config_problem(const CollectiveConfig& cfg, int world);

}  // namespace dynamiq
