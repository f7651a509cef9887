#include "hook/collective/schedule.h"

#include <algorithm>
#include <sstream>

namespace dynamiq {

const char* role_name(Role r) {
  switch (r) {
    case Role::kSendLeaf: return "send-leaf";
    case Role::kSendPending: return "send-pending";
    case Role::kSendFinal: return "send-final";
    case Role::kRecvDA: return "recv-da";
    case Role::kRecvDAR: return "recv-dar";
    case Role::kRecvSink: return "recv-sink";
    case Role::kLocalSink: return "local-sink";
    case Role::kRecvFinal: return "recv-final";
    case Role::kLocalFinal: return "local-final";
  }
  return "?";
}

int topology_chunks(Topology t, int world, Collective kind) {
  DQ_CHECK(world >= 1, "world size must be >= 1");
  if (t == Topology::kButterfly && kind == Collective::kAllReduce) {
    int p = 1;
    while (p * 2 <= world) p *= 2;
    return p;
  }
  return world;
}

BlockTable make_blocks(const Plan& plan, int64_t block_bytes) {
  DQ_CHECK(block_bytes > 0, "block_bytes must be positive");
  const int C = plan.num_chunks();
  DQ_CHECK(C >= 1, "plan has no chunks");
  DQ_CHECK(plan.wire_offset.size() == size_t(plan.num_units) + 1, "plan has no wire offsets");
  int64_t max_bytes = 0;
  for (int c = 0; c < C; ++c) {
    int64_t b = plan.wire_offset[size_t(plan.chunk_begin[size_t(c) + 1])] -
                plan.wire_offset[size_t(plan.chunk_begin[size_t(c)])];
    max_bytes = std::max(max_bytes, b);
  }
  int64_t B = std::max<int64_t>(1, ceil_div<int64_t>(max_bytes, block_bytes));
  // No point in more blocks than units in the largest chunk.
  int64_t max_units = 0;
  for (int c = 0; c < C; ++c)
    max_units = std::max(max_units, plan.chunk_begin[size_t(c) + 1] - plan.chunk_begin[size_t(c)]);
  B = std::max<int64_t>(1, std::min(B, max_units));
  DQ_CHECK(B < (1 << 20), "too many blocks per chunk: raise block_bytes");

  BlockTable bt;
  bt.blocks_per_chunk = int(B);
  bt.blocks.resize(size_t(C) * size_t(B));
  const auto& wo = plan.wire_offset;
  for (int c = 0; c < C; ++c) {
    const int64_t cb = plan.chunk_begin[size_t(c)], ce = plan.chunk_begin[size_t(c) + 1];
    const int64_t base = wo[size_t(cb)], total = wo[size_t(ce)] - base;
    int64_t prev = cb;
    for (int64_t j = 0; j < B; ++j) {
      int64_t end;
      if (j == B - 1) {
        end = ce;
      } else {
        // first wire position whose prefix reaches the (j+1)-th share of the bytes
        const int64_t target = base + (total * (j + 1)) / B;
        end = int64_t(std::lower_bound(wo.begin() + prev, wo.begin() + ce, target) - wo.begin());
        end = std::max(prev, std::min(end, ce));
      }
      bt.blocks[size_t(c * B + j)] = Block{prev, end};
      prev = end;
    }
  }
  return bt;
}

namespace {

struct Builder {
  const BlockTable& bt;
  Program prog;
  int B;
  int C;
  explicit Builder(const BlockTable& t)
      : bt(t), B(t.blocks_per_chunk), C(int(t.blocks.size()) / t.blocks_per_chunk) {}

  bool empty(int chunk, int j) const { return bt.blocks[size_t(chunk * B + j)].empty(); }
  bool add(Role r, int chunk, int j, int peer, int64_t tag) {
    if (empty(chunk, j)) return false;
    DQ_CHECK(tag >= 0 && tag < (int64_t(1) << 30), "schedule tag space exhausted");
    prog.ops.push_back(Op{r, int32_t(chunk * B + j), int32_t(peer), uint32_t(tag)});
    return true;
  }
  // One step of a rank: a send and a receive (either omitted when its block is empty).
  void step(Role sr, int sc, int sj, int speer, int64_t stag, Role rr, int rc, int rj, int rpeer,
            int64_t rtag) {
    const bool sent = add(sr, sc, sj, speer, stag);
    if (add(rr, rc, rj, rpeer, rtag) && sent) prog.ops[prog.ops.size() - 2].with_recv = true;
  }
  // The ops that add_ops() adds go in one group (Op::group_next).
  template <typename F>
  void grouped(F&& add_ops) {
    const size_t m = prog.ops.size();
    add_ops();
    for (size_t i = m; i + 1 < prog.ops.size(); ++i) prog.ops[i].group_next = true;
  }
  int64_t tag(int step, int chunk, int j) const {
    return (int64_t(step) * C + chunk) * B + j;
  }
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// Recursive halving of the ranges [0, p) for core rank r over k = log2(p) steps: keep[t] is
// the range r keeps after step t, sent[t] the half it sends away at step t. It ends with r
// keeping [r, r + 1).
std::pair<std::vector<std::pair<int, int>>, std::vector<std::pair<int, int>>> halving_ranges(int r, int p, int k) {
  std::vector<std::pair<int, int>> keep(static_cast<size_t>(k)), sent(static_cast<size_t>(k));
  int lo = 0, hi = p;
  for (int t = 0; t < k; ++t) {
    const int d = p >> (t + 1), half = (hi - lo) / 2;
    if ((r & d) == 0) {
      keep[size_t(t)] = {lo, lo + half};
      sent[size_t(t)] = {lo + half, hi};
    } else {
      keep[size_t(t)] = {lo + half, hi};
      sent[size_t(t)] = {lo, lo + half};
    }
    lo = keep[size_t(t)].first;
    hi = keep[size_t(t)].second;
  }
  DQ_CHECK(lo == r && hi == r + 1, "butterfly: rank does not end up owning its own range");
  return {keep, sent};
}

// Ring: rank r owns chunk r. Chunk c travels c+1 -> c+2 -> ... -> c (n-1 hops),
// then its final bytes travel c -> c+1 -> ... -> c-1.
// A reduce-scatter runs the first n-1 steps alone (chunk c's sink is rank c);
// an all-gather the last n-1 alone, each rank's final bytes made from its own
// shard first (kLocalFinal).
void ring(Builder& b, int r, int n, Collective kind) {
  const bool reduce = kind != Collective::kAllGather, gather = kind != Collective::kReduceScatter;
  if (n == 1) {
    for (int j = 0; j < b.B; ++j) b.add(reduce ? Role::kLocalSink : Role::kLocalFinal, 0, j, -1, 0);
    return;
  }
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
void butterfly(Builder& b, int r, int n) {
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
  if (p == 1) {  // n == 1: no extra ranks
    for (int j = 0; j < b.B; ++j) b.add(Role::kLocalSink, 0, j, -1, 0);
    return;
  }
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
void butterfly_phase(Builder& b, int r, int n, Collective kind) {
  const bool reduce = kind == Collective::kReduceScatter;
  int p = 1, k = 0;
  while (p * 2 <= n) p *= 2, ++k;
  if (n == 1) {
    for (int j = 0; j < b.B; ++j) b.add(reduce ? Role::kLocalSink : Role::kLocalFinal, 0, j, -1, 0);
    return;
  }
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

// Two-step: every rank compresses each outgoing chunk once and sends it to the
// chunk's owner, which sums in float32 and compresses the result once; then
// the owner sends its final bytes to everybody.
void twostep(Builder& b, int r, int n, Collective kind) {
  const bool reduce = kind != Collective::kAllGather, gather = kind != Collective::kReduceScatter;
  if (n == 1) {
    for (int j = 0; j < b.B; ++j) b.add(reduce ? Role::kLocalSink : Role::kLocalFinal, 0, j, -1, 0);
    return;
  }
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

Program make_program(Topology t, int rank, int world, const BlockTable& bt, Collective kind) {
  DQ_CHECK(rank >= 0 && rank < world, "rank out of range");
  Builder b(bt);
  DQ_CHECK(b.C == topology_chunks(t, world, kind), "block table has the wrong number of chunks");
  // Tags must fit in 30 bits. Checked here for the largest tag any rank of
  // the program uses, so that every rank raises the same error (a check per op
  // alone would stop only the ranks that use the largest tags, and the others
  // would wait for them until the timeout).
  const int64_t C = b.C, B = b.B;
  int64_t tag_space = 1;  // one past the largest tag of any rank
  if (world > 1) {
    switch (t) {
      case Topology::kRing: tag_space = int64_t(2) * (world - 1) * C * B; break;
      case Topology::kButterfly: {
        int k = 0;
        if (kind == Collective::kAllReduce) {
          while ((int64_t(1) << k) < C) ++k;
          tag_space = (2 * int64_t(k) + 2) * C * B;
        } else {  // steps 0 (extra ranks), 1..k, k+1 (extra ranks)
          while ((int64_t(2) << k) <= world) ++k;
          tag_space = (int64_t(k) + 2) * C * B;
        }
        break;
      }
      case Topology::kTwoStep: tag_space = 2 * B * int64_t(world); break;
    }
  }
  DQ_CHECK(tag_space <= (int64_t(1) << 30),
           "schedule tag space exhausted: " + std::to_string(C) + " chunks x " + std::to_string(B) +
               " blocks per chunk on " + std::to_string(world) +
               " ranks need too many message tags; use larger blocks (block_bytes) or smaller "
               "collectives (max_collective_bytes)");
  switch (t) {
    case Topology::kRing: ring(b, rank, world, kind); break;
    case Topology::kButterfly:
      if (kind == Collective::kAllReduce)
        butterfly(b, rank, world);
      else
        butterfly_phase(b, rank, world, kind);
      break;
    case Topology::kTwoStep: twostep(b, rank, world, kind); break;
  }
  return std::move(b.prog);
}

std::string describe_program(const Program& p) {
  std::ostringstream s;
  for (const Op& op : p.ops)
    s << role_name(op.role) << " b" << op.block << " peer" << op.peer << " tag" << op.tag
      << (op.with_recv ? " +recv" : "") << "\n";
  return s.str();
}

}  // namespace dynamiq
