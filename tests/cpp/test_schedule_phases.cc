// The schedules of every registered topology (the test-only ones included),
// checked symbolically (no codec, no transport): every rank's program runs
// against a mailbox, each message carrying the set of ranks whose parts it
// sums. For every topology, each collective it runs, and world size 1..17:
//  - every send has a receive of the same block, tag and peers (and back);
//  - the programs run to the end without waiting for a message nobody sends;
//  - reduce-scatter: chunk c has exactly one sink, rank c, and what it sums
//    holds every rank's part exactly once (a part counted twice or missed
//    shows as a wrong set); no rank outputs another rank's chunk;
//  - all-gather: every rank ends with every chunk's final bytes, and those
//    are the bytes its owner made from its own shard (kLocalFinal), made
//    once: no rank compresses a shard that is not its own;
//  - all-reduce: every block has one sink, whose sum holds every rank's part
//    once, and every rank ends with that sink's final bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "hook/collective/topology.h"
#include "kernels/identity/identity_codec.h"

namespace dynamiq {
namespace {

using Mask = uint64_t;  // ranks whose parts a value holds (bit r: rank r)

struct Outcome {
  bool finished = false;
  std::string error;
  // reduce-scatter: (rank, block) -> set summed by the sink
  std::map<std::pair<int, int>, Mask> sinks;
  // all-gather, all-reduce: (rank, block) -> the parts in the final bytes it
  // holds (all-gather: its owner's shard alone)
  std::map<std::pair<int, int>, Mask> finals;
  int local_finals_of_foreign_chunks = 0;
};

Outcome run_symbolic(Topology t, int n, const BlockTable& bt, Collective kind) {
  std::vector<Program> progs;
  for (int r = 0; r < n; ++r) progs.push_back(make_program(t, r, n, bt, kind));
  const int B = bt.blocks_per_chunk;
  Outcome out;
  // Messages: (src, dst, tag) -> (parts summed, whether they are final bytes)
  std::map<std::tuple<int, int, uint32_t>, std::pair<Mask, bool>> box;
  std::vector<size_t> pc(static_cast<size_t>(n), 0);
  // per rank and block: local value state
  std::vector<std::map<int, Mask>> acc(static_cast<size_t>(n)), pending(static_cast<size_t>(n));
  std::vector<std::map<int, Mask>> fin(static_cast<size_t>(n));  // block -> the parts in its final bytes
  auto local = [&](int r, int block) {
    auto it = acc[size_t(r)].find(block);
    return it != acc[size_t(r)].end() ? it->second : Mask(1) << r;
  };
  auto add = [&](Mask a, Mask b) {
    if (a & b) out.error = "a part is summed twice";
    return a | b;
  };
  bool progress = true;
  while (progress && out.error.empty()) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      const Program& p = progs[size_t(r)];
      while (pc[size_t(r)] < p.ops.size() && out.error.empty()) {
        const Op& op = p.ops[size_t(pc[size_t(r)])];
        const int chunk = op.block / B;
        if (is_send(op.role)) {
          std::pair<Mask, bool> v{0, false};
          if (op.role == Role::kSendLeaf) {
            v.first = local(r, op.block);
          } else if (op.role == Role::kSendPending) {
            if (!pending[size_t(r)].count(op.block)) out.error = "send-pending without pending bytes";
            v.first = pending[size_t(r)][op.block];
          } else {
            if (!fin[size_t(r)].count(op.block)) out.error = "send-final without final bytes";
            v = {fin[size_t(r)][op.block], true};
          }
          const auto key = std::make_tuple(r, op.peer, op.tag);
          if (box.count(key)) out.error = "two messages with one tag";
          box[key] = v;
        } else if (is_recv(op.role)) {
          const auto key = std::make_tuple(op.peer, r, op.tag);
          auto it = box.find(key);
          if (it == box.end()) break;  // not sent yet
          const auto v = it->second;
          box.erase(it);
          if (v.second != (op.role == Role::kRecvFinal)) out.error = "final bytes summed, or partial sums as final";
          switch (op.role) {
            case Role::kRecvDA: acc[size_t(r)][op.block] = add(local(r, op.block), v.first); break;
            case Role::kRecvDAR: pending[size_t(r)][op.block] = add(local(r, op.block), v.first); break;
            case Role::kRecvSink:
              if (out.sinks.count({r, op.block})) out.error = "two sinks of one block on a rank";
              out.sinks[{r, op.block}] = fin[size_t(r)][op.block] = out.finals[{r, op.block}] =
                  add(local(r, op.block), v.first);
              if (kind == Collective::kReduceScatter && chunk != r)
                out.error = "rank " + std::to_string(r) + " is the sink of chunk " + std::to_string(chunk);
              break;
            case Role::kRecvFinal:
              if (fin[size_t(r)].count(op.block)) out.error = "final bytes received twice";
              fin[size_t(r)][op.block] = out.finals[{r, op.block}] = v.first;
              break;
            default: out.error = "bad receive role";
          }
        } else if (op.role == Role::kLocalSink) {
          out.sinks[{r, op.block}] = fin[size_t(r)][op.block] = out.finals[{r, op.block}] = local(r, op.block);
          if (kind == Collective::kReduceScatter && chunk != r) out.error = "local sink of a foreign chunk";
        } else if (op.role == Role::kLocalFinal) {
          if (chunk != r) out.local_finals_of_foreign_chunks += 1;
          fin[size_t(r)][op.block] = out.finals[{r, op.block}] = Mask(1) << r;
        }
        ++pc[size_t(r)];
        progress = true;
      }
    }
  }
  out.finished = true;
  for (int r = 0; r < n; ++r)
    if (pc[size_t(r)] != progs[size_t(r)].ops.size()) out.finished = false;
  if (!box.empty() && out.error.empty()) out.error = std::to_string(box.size()) + " messages never received";
  return out;
}

TEST(SchedulePhases, ReduceScatterSinksAreTheChunkOwnersAndSumEveryRankOnce) {
  for (Topology t : schedule_topologies(Collective::kReduceScatter))
    for (int n = 1; n <= 17; ++n)
      for (int64_t numel : {int64_t(n) * 4096, int64_t(n) * 256}) {  // several blocks per chunk; one
        SCOPED_TRACE(std::string(topology_name(t)) + " n=" + std::to_string(n) + " numel=" + std::to_string(numel));
        ASSERT_EQ(topology_chunks(t, n, Collective::kReduceScatter), n);
        const Plan plan = make_identity_plan(DType::kF32, numel, n);
        const BlockTable bt = make_blocks(plan, 4096);
        const Outcome o = run_symbolic(t, n, bt, Collective::kReduceScatter);
        ASSERT_TRUE(o.error.empty()) << o.error;
        ASSERT_TRUE(o.finished) << "a rank waits for a message nobody sends";
        const Mask all = n == 64 ? ~Mask(0) : (Mask(1) << n) - 1;
        size_t nonempty = 0;
        for (size_t b = 0; b < bt.blocks.size(); ++b) {
          if (bt.blocks[b].empty()) continue;
          ++nonempty;
          const int owner = int(b) / bt.blocks_per_chunk;
          auto it = o.sinks.find({owner, int(b)});
          ASSERT_NE(it, o.sinks.end()) << "block " << b << " has no sink on rank " << owner;
          EXPECT_EQ(it->second, all) << "block " << b;
        }
        EXPECT_EQ(o.sinks.size(), nonempty) << "a block has a sink outside its owner";
      }
}

TEST(SchedulePhases, AllGatherDeliversEveryShardCompressedOnceByItsOwner) {
  for (Topology t : schedule_topologies(Collective::kAllGather))
    for (int n = 1; n <= 17; ++n) {
      SCOPED_TRACE(std::string(topology_name(t)) + " n=" + std::to_string(n));
      const Plan plan = make_identity_plan(DType::kF32, int64_t(n) * 4096, n);
      const BlockTable bt = make_blocks(plan, 4096);
      const Outcome o = run_symbolic(t, n, bt, Collective::kAllGather);
      ASSERT_TRUE(o.error.empty()) << o.error;
      ASSERT_TRUE(o.finished);
      EXPECT_EQ(o.local_finals_of_foreign_chunks, 0);
      EXPECT_TRUE(o.sinks.empty());
      for (int r = 0; r < n; ++r)
        for (size_t b = 0; b < bt.blocks.size(); ++b) {
          if (bt.blocks[b].empty()) continue;
          auto it = o.finals.find({r, int(b)});
          ASSERT_NE(it, o.finals.end()) << "rank " << r << " lacks block " << b;
          EXPECT_EQ(it->second, Mask(1) << (int(b) / bt.blocks_per_chunk)) << "rank " << r << " block " << b;
        }
    }
}

// Each message is sent once per hop and each rank sends its share: for an
// all-gather of n shards of W wire bytes, a ring and two-step send (n-1) W per
// rank; a butterfly on a power of two too, and on other worlds the core ranks
// also serve the extra ranks.
TEST(SchedulePhases, AllGatherMessageCounts) {
  for (Topology t : schedule_topologies(Collective::kAllGather))
    for (int n : {2, 3, 4, 5, 8}) {
      const Plan plan = make_identity_plan(DType::kF32, int64_t(n) * 4096, n);
      const BlockTable bt = make_blocks(plan, 4096);  // 4 blocks per chunk
      int64_t sends = 0;
      for (int r = 0; r < n; ++r)
        for (const Op& op : make_program(t, r, n, bt, Collective::kAllGather).ops) sends += is_send(op.role);
      // every rank receives every other shard exactly once
      EXPECT_EQ(sends, int64_t(n) * (n - 1) * bt.blocks_per_chunk) << topology_name(t) << " n=" << n;
    }
}

TEST(SchedulePhases, EveryMessageHasAMatchingReceive) {
  for (Collective kind : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather})
    for (Topology t : schedule_topologies(kind))
      for (int n = 1; n <= 17; ++n) {
        const Plan plan = make_identity_plan(DType::kF32, 50000, topology_chunks(t, n, kind));
        const BlockTable bt = make_blocks(plan, 4096);
        std::multiset<std::tuple<int, int, uint32_t, int>> sends, recvs;
        for (int r = 0; r < n; ++r)
          for (const Op& op : make_program(t, r, n, bt, kind).ops) {
            if (is_send(op.role)) sends.insert({r, op.peer, op.tag, op.block});
            if (is_recv(op.role)) recvs.insert({op.peer, r, op.tag, op.block});
          }
        EXPECT_EQ(sends, recvs) << collective_name(kind) << " " << topology_name(t) << " n=" << n;
      }
}

TEST(SchedulePhases, AllReduceLeavesEveryRankWithTheFullSum) {
  for (Topology t : schedule_topologies(Collective::kAllReduce))
    for (int n = 1; n <= 17; ++n)
      for (int64_t numel : {int64_t(n) * 4096, int64_t(300)}) {  // several blocks per chunk; empty blocks
        SCOPED_TRACE(std::string(topology_name(t)) + " n=" + std::to_string(n) + " numel=" + std::to_string(numel));
        const Plan plan = make_identity_plan(DType::kF32, numel, topology_chunks(t, n));
        const BlockTable bt = make_blocks(plan, 4096);
        const Outcome o = run_symbolic(t, n, bt, Collective::kAllReduce);
        ASSERT_TRUE(o.error.empty()) << o.error;
        ASSERT_TRUE(o.finished) << "a rank waits for a message nobody sends";
        const Mask all = (Mask(1) << n) - 1;
        size_t nonempty = 0;
        for (size_t b = 0; b < bt.blocks.size(); ++b) {
          if (bt.blocks[b].empty()) continue;
          ++nonempty;
          for (int r = 0; r < n; ++r) {
            auto it = o.finals.find({r, int(b)});
            ASSERT_NE(it, o.finals.end()) << "rank " << r << " lacks block " << b;
            EXPECT_EQ(it->second, all) << "rank " << r << " block " << b;
          }
        }
        EXPECT_EQ(o.sinks.size(), nonempty) << "a block with no sink or two";
      }
}

}  // namespace
// make_blocks cuts each chunk at unit boundaries into blocks_per_chunk blocks of about equal wire
// bytes: in order, every unit in exactly one block, and never more blocks than the largest chunk
// has units (a smaller block_bytes would only add empty blocks: table entries, tags and, for a
// tiny block_bytes on a large bucket, the "too many blocks" error), so the largest chunk has no
// empty block.
TEST(SchedulePhases, BlocksCoverEachChunkInOrderAndAreNoMoreThanItsUnits) {
  for (int n : {1, 2, 3, 5})
    for (int64_t numel : {int64_t(1000), int64_t(5000), int64_t(70001)})
      for (int64_t block_bytes : {int64_t(1), int64_t(64), int64_t(1000), int64_t(4096), int64_t(1) << 20}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " numel=" + std::to_string(numel) + " block_bytes=" +
                     std::to_string(block_bytes));
        const Plan plan = make_identity_plan(DType::kF32, numel, n);
        const BlockTable bt = make_blocks(plan, block_bytes);
        const int B = bt.blocks_per_chunk;
        ASSERT_GE(B, 1);
        ASSERT_EQ(bt.blocks.size(), size_t(plan.num_chunks()) * size_t(B));
        int64_t max_units = 0;
        int largest = 0;
        for (int c = 0; c < plan.num_chunks(); ++c) {
          const int64_t cb = plan.chunk_begin[size_t(c)], ce = plan.chunk_begin[size_t(c) + 1];
          if (ce - cb > max_units) max_units = ce - cb, largest = c;
          int64_t prev = cb;
          for (int j = 0; j < B; ++j) {
            const Block& b = bt.blocks[size_t(c) * size_t(B) + size_t(j)];
            ASSERT_EQ(b.w0, prev) << "chunk " << c << " block " << j;
            ASSERT_GE(b.w1, b.w0) << "chunk " << c << " block " << j;
            prev = b.w1;
          }
          ASSERT_EQ(prev, ce) << "chunk " << c;
        }
        EXPECT_LE(B, max_units);
        for (int j = 0; j < B; ++j)
          EXPECT_FALSE(bt.blocks[size_t(largest) * size_t(B) + size_t(j)].empty()) << "block " << j;
      }
}

}  // namespace dynamiq
