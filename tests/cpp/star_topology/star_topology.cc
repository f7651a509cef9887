// A test-only topology, "star": every rank sends its whole bucket (one chunk)
// to rank 0, which sums the messages into its own and compresses the sum once;
// then rank 0 sends those final bytes to every rank. All-reduce only (a
// reduce-scatter or all-gather needs chunk c's sink at rank c). It lives
// entirely in this folder and is registered with the one line at the end of
// this file: the worked example of docs/architecture.md "Adding a topology".
#include "hook/collective/topology.h"

namespace dynamiq {
namespace star_test {
namespace {

constexpr int kHub = 0;

void star(ScheduleBuilder& b, int r, int n, Collective kind) {
  if (n == 1) return b.world_of_one(kind);
  // step 0: the leaves' buckets to the hub (tag (0, 0, j)); step 1: the hub's
  // final bytes back (tag (1, 0, j)). The hub's receives of one block are one
  // group on ordered transports, and so are its sends.
  if (r != kHub) {
    for (int j = 0; j < b.B; ++j) b.add(Role::kSendLeaf, 0, j, kHub, b.tag(0, 0, j));
    for (int j = 0; j < b.B; ++j) b.add(Role::kRecvFinal, 0, j, kHub, b.tag(1, 0, j));
    return;
  }
  for (int j = 0; j < b.B; ++j)
    b.grouped([&] {
      for (int leaf = 1; leaf < n; ++leaf)
        b.add(leaf < n - 1 ? Role::kRecvDA : Role::kRecvSink, 0, j, leaf, b.tag(0, 0, j));
    });
  for (int j = 0; j < b.B; ++j)
    b.grouped([&] {
      for (int leaf = 1; leaf < n; ++leaf) b.add(Role::kSendFinal, 0, j, leaf, b.tag(1, 0, j));
    });
}

TopologyDef star_topology() {
  TopologyDef d;
  d.name = "star";
  d.id = Topology(200);  // an id the built-in topologies do not use
  d.collectives = kAllReduceOnly;
  d.schedule = star;
  d.chunks = [](int, Collective) { return 1; };
  d.tag_steps = [](int, Collective) { return int64_t(2); };
  d.rounds = [](int) { return 2.0; };
  d.bytes = [](int n) { return double(n - 1); };  // the hub's: n - 1 copies of the bucket out
  return d;
}

}  // namespace

// The registration line.
const bool kRegistered = (register_topology(star_topology()), true);

}  // namespace star_test
}  // namespace dynamiq
