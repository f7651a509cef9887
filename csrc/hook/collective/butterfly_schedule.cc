// Topology "butterfly": its schedules (the all-reduce; the reduce-scatter and
// all-gather phases alone) and its registry entry (topology.h).
#include <algorithm>
#include <bit>

#include "hook/collective/topology.h"

namespace dynamiq {
namespace {

int floor_log2(int n) { return int(std::bit_width(unsigned(n))) - 1; }  // n >= 1

// Butterfly (recursive halving, then recursive doubling) on p = 2^k ranks
// owning one chunk each: after the halving steps rank c < p holds chunk c.
// Ranks p..n-1 (when n is not a power of two) take part like two-step's
// senders: an extra rank compresses each chunk once and sends it straight to
// the chunk's owner (block j of every chunk, then block j+1), which adds each
// block (in float, with its own partial sum) just before that block's last
// halving step; the owner sends its finished chunk back to every extra rank
// after the halving steps, before the doubling ones. So no rank carries an
// extra rank's whole bucket and the extra ranks' traffic overlaps the
// butterfly's (an earlier fold into one partner, which got the whole bucket
// and sent all of it back, was 2.26x of Gloo where this is 2.62x, dynamiq,
// 3 ranks at 1 Gbit/s; ring is still faster there: experiments/RESULTS.md).
void butterfly(ScheduleBuilder& b, int r, int n) {
  const int p = b.C;
  int k = 0;
  while ((1 << k) < p) ++k;
  const int extra_step = 0, last_step = 2 * k + 1;
  if (r >= p) {
    // An extra rank: each chunk to its owner, each finished chunk back from it,
    // block by block across the owners (block j of every chunk, then block j+1)
    // in the order the owners take them, so that all owners advance together.
    for (int j = 0; j < b.B; ++j)
      b.grouped([&] {
        for (int c = 0; c < p; ++c) b.add(Role::kSendLeaf, c, j, c, b.tag(extra_step, c, j));
      });
    for (int j = 0; j < b.B; ++j)
      b.grouped([&] {
        for (int c = 0; c < p; ++c) b.add(Role::kRecvFinal, c, j, c, b.tag(last_step, c, j));
      });
    return;
  }
  if (p == 1) return b.world_of_one(Collective::kAllReduce);  // n == 1: no extra ranks
  // keep[t] = chunk range kept after step t; sent[t] = the range sent at step t.
  const auto [keep, sent] = halving_ranges(r, p, k);
  for (int t = 0; t < k; ++t) {
    const int partner = r ^ (p >> (t + 1));
    const int step = 1 + t;
    // Role of each received block: sent on at step t+1 -> fused DAR; kept -> DA; last step -> sink.
    auto recv_role = [&](int c) {
      if (t == k - 1) return Role::kRecvSink;
      const auto& s1 = sent[size_t(t) + 1];
      return (c >= s1.first && c < s1.second) ? Role::kRecvDAR : Role::kRecvDA;
    };
    const auto& S = sent[size_t(t)];
    const auto& K = keep[size_t(t)];
    // Interleave sends and receives block by block (same count on both sides);
    // block j of every chunk sent at this step, then block j+1: each step's
    // sends need only the previous step's receives, so the chunks of one
    // block index are one group on ordered transports (one round per step and
    // block instead of one per chunk and block).
    const int nc = S.second - S.first;
    // At the last halving step (one chunk each way: rc == r) each block first
    // takes the extra ranks' share of it.
    for (int j = 0; j < b.B; ++j)
      b.grouped([&] {
        for (int i = 0; i < nc; ++i) {
          const int sc = S.first + i, rc = K.first + i;
          if (t == k - 1)
            for (int e = p; e < n; ++e) b.add(Role::kRecvDA, rc, j, e, b.tag(extra_step, rc, j));
          b.step(t == 0 ? Role::kSendLeaf : Role::kSendPending, sc, j, partner, b.tag(step, sc, j),
                 recv_role(rc), rc, j, partner, b.tag(step, rc, j));
        }
      });
  }
  // The finished chunk back to the extra ranks, after the halving steps: a
  // final sent in between could wait (send window, or NCCL's one stream per
  // rank) for an extra rank still sending its later blocks to this one.
  for (int j = 0; j < b.B; ++j)
    b.grouped([&] {
      for (int e = p; e < n; ++e) b.add(Role::kSendFinal, r, j, e, b.tag(last_step, r, j));
    });
  for (int t = k - 1; t >= 0; --t) {
    const int partner = r ^ (p >> (t + 1));
    const int step = 1 + k + (k - 1 - t);
    const auto& S = sent[size_t(t)];
    const auto& K = keep[size_t(t)];
    const int nc = K.second - K.first;
    for (int j = 0; j < b.B; ++j)
      b.grouped([&] {
        for (int i = 0; i < nc; ++i) {
          const int sc = K.first + i, rc = S.first + i;
          b.step(Role::kSendFinal, sc, j, partner, b.tag(step, sc, j), Role::kRecvFinal, rc, j, partner,
                 b.tag(step, rc, j));
        }
      });
  }
}

// Butterfly reduce-scatter (recursive halving) and all-gather (recursive
// doubling) on n ranks, p = the largest power of two <= n, over n chunks
// (chunk c = shard c). The halving and doubling steps run among the core
// ranks 0..p-1 over *groups*: group g holds chunk g and, when g + p < n,
// chunk g + p; after the halving steps core rank g holds its group summed over
// the core ranks. Extra ranks e >= p (n not a power of two):
//  - reduce-scatter: e compresses its part of every chunk c != e once and
//    sends it to c's core rank, which adds it (kRecvDA) just before that
//    block's last halving step; core rank g then sends its partial sum of
//    chunk g + p (kRecvDAR at the last step) to rank g + p, whose sink adds its
//    own part. So every sink is its chunk's rank and no rank sends an extra
//    rank's whole input anywhere; the core ranks with an extra partner carry
//    its chunk through the halving steps (at most 2 chunks per group).
//  - all-gather: e sends its final bytes to core rank e - p before the
//    doubling steps, and receives every other chunk from that chunk's core
//    rank after them (each core rank sends its group's chunks to every extra).
void butterfly_phase(ScheduleBuilder& b, int r, int n, Collective kind) {
  const bool reduce = kind == Collective::kReduceScatter;
  int p = 1, k = 0;
  while (p * 2 <= n) p *= 2, ++k;
  if (n == 1) return b.world_of_one(kind);
  const int extra_step = 0, last_step = k + 1;
  // chunks of the groups [lo, hi): the groups' first chunks, then their second ones
  auto chunks_of = [&](int lo, int hi) {
    std::vector<int> cs;
    for (int g = lo; g < hi; ++g) cs.push_back(g);
    for (int g = lo; g < hi; ++g)
      if (g + p < n) cs.push_back(g + p);
    return cs;
  };
  auto group_of = [&](int c) { return c < p ? c : c - p; };
  if (r >= p) {
    const int core = r - p;
    if (reduce) {
      for (int j = 0; j < b.B; ++j)
        b.grouped([&] {
          for (int g = 0; g < p; ++g)
            for (int c : chunks_of(g, g + 1))
              if (c != r) b.add(Role::kSendLeaf, c, j, g, b.tag(extra_step, c, j));
        });
      for (int j = 0; j < b.B; ++j) b.add(Role::kRecvSink, r, j, core, b.tag(last_step, r, j));
    } else {
      for (int j = 0; j < b.B; ++j) {
        b.add(Role::kLocalFinal, r, j, -1, 0);
        b.add(Role::kSendFinal, r, j, core, b.tag(extra_step, r, j));
      }
      for (int j = 0; j < b.B; ++j)
        b.grouped([&] {
          for (int g = 0; g < p; ++g)
            for (int c : chunks_of(g, g + 1))
              if (c != r) b.add(Role::kRecvFinal, c, j, g, b.tag(last_step, c, j));
        });
    }
    return;
  }
  // keep[t] = groups kept after step t; sent[t] = the groups sent at step t.
  const auto [keep, sent] = halving_ranges(r, p, k);
  const int partner_chunk = r + p < n ? r + p : -1;  // the extra rank's chunk this core rank serves
  // One exchange with `partner`: send `S`, receive `R`, block by block; send
  // i and receive i form one step where both exist.
  auto exchange = [&](int step, int partner, const std::vector<int>& S, Role sr, const std::vector<int>& R,
                      auto&& recv_role, auto&& before_recv) {
    for (int j = 0; j < b.B; ++j)
      b.grouped([&] {
        const size_t m = std::max(S.size(), R.size());
        for (size_t i = 0; i < m; ++i) {
          if (i < R.size()) before_recv(R[i], j);
          if (i < S.size() && i < R.size()) {
            b.step(sr, S[i], j, partner, b.tag(step, S[i], j), recv_role(R[i]), R[i], j, partner,
                   b.tag(step, R[i], j));
          } else if (i < S.size()) {
            b.add(sr, S[i], j, partner, b.tag(step, S[i], j));
          } else {
            b.add(recv_role(R[i]), R[i], j, partner, b.tag(step, R[i], j));
          }
        }
      });
  };
  auto nothing = [](int, int) {};
  if (reduce) {
    for (int t = 0; t < k; ++t) {
      const int partner = r ^ (p >> (t + 1));
      const auto& S = sent[size_t(t)];
      const auto& K = keep[size_t(t)];
      // received chunks: summed and sent on at step t+1 -> fused DAR; kept -> DA;
      // last step: the own chunk -> sink, the extra partner's -> DAR (sent to it after)
      auto recv_role = [&](int c) {
        if (t == k - 1) return c == r ? Role::kRecvSink : Role::kRecvDAR;
        const auto& s1 = sent[size_t(t) + 1];
        return (group_of(c) >= s1.first && group_of(c) < s1.second) ? Role::kRecvDAR : Role::kRecvDA;
      };
      // at the last step each block first takes the extra ranks' parts of it
      auto extras_first = [&](int c, int j) {
        if (t != k - 1) return;
        for (int e = p; e < n; ++e)
          if (e != c) b.add(Role::kRecvDA, c, j, e, b.tag(extra_step, c, j));
      };
      exchange(1 + t, partner, chunks_of(S.first, S.second), t == 0 ? Role::kSendLeaf : Role::kSendPending,
               chunks_of(K.first, K.second), recv_role, extras_first);
    }
    if (partner_chunk >= 0)
      for (int j = 0; j < b.B; ++j) b.add(Role::kSendPending, partner_chunk, j, partner_chunk, b.tag(last_step, partner_chunk, j));
    return;
  }
  for (int j = 0; j < b.B; ++j) {
    b.add(Role::kLocalFinal, r, j, -1, 0);
    if (partner_chunk >= 0) b.add(Role::kRecvFinal, partner_chunk, j, partner_chunk, b.tag(extra_step, partner_chunk, j));
  }
  for (int t = k - 1; t >= 0; --t) {
    const int partner = r ^ (p >> (t + 1));
    const auto& S = sent[size_t(t)];
    const auto& K = keep[size_t(t)];
    exchange(1 + (k - 1 - t), partner, chunks_of(K.first, K.second), Role::kSendFinal, chunks_of(S.first, S.second),
             [](int) { return Role::kRecvFinal; }, nothing);
  }
  // the group's chunks to every extra rank
  for (int j = 0; j < b.B; ++j)
    b.grouped([&] {
      for (int e = p; e < n; ++e)
        for (int c : chunks_of(r, r + 1))
          if (c != e) b.add(Role::kSendFinal, c, j, e, b.tag(last_step, c, j));
    });
}

void schedule(ScheduleBuilder& b, int r, int n, Collective kind) {
  if (kind == Collective::kAllReduce)
    butterfly(b, r, n);
  else
    butterfly_phase(b, r, n, kind);
}

}  // namespace

TopologyDef butterfly_topology() {
  TopologyDef d;
  d.collectives = kEveryCollective;
  d.schedule = schedule;
  // an all-reduce: one chunk per core rank (the largest power of two <= n)
  d.chunks = [](int n, Collective kind) { return kind == Collective::kAllReduce ? 1 << floor_log2(n) : n; };
  // all-reduce on p = 2^k chunks: steps 0 (extra ranks), 1..2k, 2k+1 (extra
  // ranks); a phase alone: steps 0, 1..k, k+1
  d.tag_steps = [](int n, Collective kind) {
    const int64_t k = floor_log2(n);
    return kind == Collective::kAllReduce ? 2 * k + 2 : k + 2;
  };
  d.rounds = [](int n) {
    int k = 0;
    while ((1 << k) < n) ++k;
    return 2.0 * k;
  };
  // (the model's figure for every schedule; on a world that is not a power of
  // two a core rank with an extra partner sends more)
  d.bytes = [](int n) { return 2.0 * (n - 1) / n; };
  return d;
}

}  // namespace dynamiq
