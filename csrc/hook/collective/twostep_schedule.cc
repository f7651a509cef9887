// Topology "twostep": its schedule and its registry entry (topology.h).
#include "hook/collective/topology.h"

namespace dynamiq {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Two-step: every rank compresses each outgoing chunk once and sends it to the
// chunk's owner, which sums in float32 and compresses the result once; then
// the owner sends its final bytes to everybody.
void twostep(ScheduleBuilder& b, int r, int n, Collective kind) {
  const bool reduce = kind != Collective::kAllGather, gather = kind != Collective::kReduceScatter;
  if (n == 1) return b.world_of_one(kind);
  // Block j to and from every peer: one group on ordered transports.
  for (int j = 0; j < (reduce ? b.B : 0); ++j)
    b.grouped([&] {
      for (int i = 1; i < n; ++i) {
        const int dst = mod(r + i, n), src = mod(r - i, n);
        // Tag by (step, block, offset i): both ends compute i = (dst - src) mod n.
        const int64_t tag = int64_t(j) * n + i;
        b.step(Role::kSendLeaf, dst, j, dst, tag, i < n - 1 ? Role::kRecvDA : Role::kRecvSink, r, j, src, tag);
      }
    });
  for (int j = 0; j < (gather ? b.B : 0); ++j) {
    if (!reduce) b.add(Role::kLocalFinal, r, j, -1, 0);
    b.grouped([&] {
      for (int i = 1; i < n; ++i) {
        const int dst = mod(r + i, n), src = mod(r - i, n);
        const int64_t tag = (int64_t(b.B) + j) * n + i;
        b.step(Role::kSendFinal, r, j, dst, tag, Role::kRecvFinal, src, j, src, tag);
      }
    });
  }
}

}  // namespace

TopologyDef twostep_topology() {
  TopologyDef d;
  d.collectives = kEveryCollective;
  d.schedule = twostep;
  // tags (block, offset) below B x n for the reduce step, then below 2 x B x n
  // for the gather step; C = n chunks
  d.tag_steps = [](int, Collective) { return int64_t(2); };
  d.rounds = [](int) { return 2.0; };
  d.bytes = [](int n) { return 2.0 * (n - 1) / n; };
  return d;
}

}  // namespace dynamiq
