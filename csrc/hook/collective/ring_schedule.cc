// Topology "ring": its schedule and its registry entry (topology.h).
#include "hook/collective/topology.h"

namespace dynamiq {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Ring: rank r owns chunk r. Chunk c travels c+1 -> c+2 -> ... -> c (n-1 hops),
// then its final bytes travel c -> c+1 -> ... -> c-1.
// A reduce-scatter runs the first n-1 steps alone (chunk c's sink is rank c);
// an all-gather the last n-1 alone, each rank's final bytes made from its own
// shard first (kLocalFinal).
void ring(ScheduleBuilder& b, int r, int n, Collective kind) {
  const bool reduce = kind != Collective::kAllGather, gather = kind != Collective::kReduceScatter;
  if (n == 1) return b.world_of_one(kind);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  for (int s = 0; s < (reduce ? n - 1 : 0); ++s) {
    const int sc = mod(r - 1 - s, n), rc = mod(r - 2 - s, n);
    for (int j = 0; j < b.B; ++j) {
      b.step(s == 0 ? Role::kSendLeaf : Role::kSendPending, sc, j, next, b.tag(s, sc, j),
             s < n - 2 ? Role::kRecvDAR : Role::kRecvSink, rc, j, prev, b.tag(s, rc, j));
    }
  }
  for (int g = 0; g < (gather ? n - 1 : 0); ++g) {
    const int step = n - 1 + g;
    const int sc = mod(r - g, n), rc = mod(r - 1 - g, n);
    for (int j = 0; j < b.B; ++j) {
      if (!reduce && g == 0) b.add(Role::kLocalFinal, sc, j, -1, 0);
      b.step(Role::kSendFinal, sc, j, next, b.tag(step, sc, j), Role::kRecvFinal, rc, j, prev,
             b.tag(step, rc, j));
    }
  }
}

}  // namespace

TopologyDef ring_topology() {
  TopologyDef d;
  d.collectives = kEveryCollective;
  d.schedule = ring;
  // steps 0 .. n-2 reduce, n-1 .. 2n-3 gather (a phase alone uses its half)
  d.tag_steps = [](int n, Collective) { return int64_t(2) * (n - 1); };
  d.rounds = [](int n) { return 2.0 * (n - 1); };
  d.bytes = [](int n) { return 2.0 * (n - 1) / n; };
  return d;
}

}  // namespace dynamiq
