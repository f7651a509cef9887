#include "hook/collective/schedule.h"

#include <algorithm>
#include <sstream>

#include "hook/collective/topology.h"

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
  const TopologyDef& d = topology_for(t, kind);
  DQ_CHECK(!d.composition(), "topology '" + d.name + "' is a composition, not a schedule");
  if (!d.chunks) return world;
  const int c = d.chunks(world, kind);
  DQ_CHECK(c >= 1 && c <= world && (kind == Collective::kAllReduce || c == world),
           "topology '" + d.name + "': " + std::to_string(c) + " chunks on " + std::to_string(world) + " ranks");
  return c;
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

ScheduleBuilder::ScheduleBuilder(const BlockTable& t, int64_t tag_space, const char* topology)
    : bt(t), B(t.blocks_per_chunk), C(int(t.blocks.size()) / t.blocks_per_chunk), tag_space_(tag_space),
      topology_(topology) {}

bool ScheduleBuilder::add(Role r, int chunk, int j, int peer, int64_t tag) {
  DQ_CHECK(chunk >= 0 && chunk < C && j >= 0 && j < B, std::string("topology '") + topology_ + "': block (" +
                                                           std::to_string(chunk) + ", " + std::to_string(j) +
                                                           ") outside the block table");
  if (empty(chunk, j)) return false;
  if (peer < 0) tag = 0;  // a local op: no message
  DQ_CHECK(tag >= 0 && tag < tag_space_, std::string("topology '") + topology_ + "': tag " + std::to_string(tag) +
                                             " outside its declared tag space of " + std::to_string(tag_space_) +
                                             " (TopologyDef::tag_steps)");
  prog_.ops.push_back(Op{r, int32_t(chunk * B + j), int32_t(peer), uint32_t(tag)});
  return true;
}

void ScheduleBuilder::step(Role sr, int sc, int sj, int speer, int64_t stag, Role rr, int rc, int rj, int rpeer,
                           int64_t rtag) {
  const bool sent = add(sr, sc, sj, speer, stag);
  if (add(rr, rc, rj, rpeer, rtag) && sent) prog_.ops[prog_.ops.size() - 2].with_recv = true;
}

void ScheduleBuilder::world_of_one(Collective kind) {
  for (int j = 0; j < B; ++j) add(kind == Collective::kAllGather ? Role::kLocalFinal : Role::kLocalSink, 0, j, -1, 0);
}

std::pair<RangeList, RangeList> halving_ranges(int r, int p, int k) {
  RangeList keep(static_cast<size_t>(k)), sent(static_cast<size_t>(k));
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

Program make_program(Topology t, int rank, int world, const BlockTable& bt, Collective kind) {
  DQ_CHECK(rank >= 0 && rank < world, "rank out of range");
  const TopologyDef& d = topology_for(t, kind);
  DQ_CHECK(!d.composition(), "topology '" + d.name + "' is a composition, not a schedule");
  const int64_t B = bt.blocks_per_chunk, C = int64_t(bt.blocks.size()) / B;
  DQ_CHECK(C == topology_chunks(t, world, kind), "block table has the wrong number of chunks");
  // Tags must fit in 30 bits. Checked here for the largest tag any rank of
  // the program may use (the declared tag space), so that every rank raises
  // the same error (a check per op alone would stop only the ranks that use
  // the largest tags, and the others would wait for them until the timeout).
  const int64_t steps = world > 1 ? d.tag_steps(world, kind) : 0;
  DQ_CHECK(steps >= 0, "topology '" + d.name + "': negative tag steps");
  const bool fits = steps <= (int64_t(1) << 30) / (C * B);
  DQ_CHECK(fits, "schedule tag space exhausted: " + std::to_string(C) + " chunks x " + std::to_string(B) +
                     " blocks per chunk on " + std::to_string(world) +
                     " ranks need too many message tags; use larger blocks (block_bytes) or smaller "
                     "collectives (max_collective_bytes)");
  ScheduleBuilder b(bt, std::max<int64_t>(1, steps * C * B), d.name.c_str());
  d.schedule(b, rank, world, kind);
  return b.take();
}

std::string describe_program(const Program& p) {
  std::ostringstream s;
  for (const Op& op : p.ops)
    s << role_name(op.role) << " b" << op.block << " peer" << op.peer << " tag" << op.tag
      << (op.with_recv ? " +recv" : "") << "\n";
  return s.str();
}

}  // namespace dynamiq
