// Topology schedules: for one rank, the ordered list of sends, receives and
// local steps of an all-reduce over blocks, with the kernel role of each.
// Schedules know blocks and peers, never codecs; the executor runs any
// schedule with any codec. Each schedule is a function in a file of its own
// (ring_schedule.cc, butterfly_schedule.cc, twostep_schedule.cc) that adds a
// rank's ops through a ScheduleBuilder, listed in the topology registry
// (topology.h); make_program looks it up there.
//
// Roles (DynamiQ paper section 3.4, ZCCL compress-once forwarding):
//   kSendLeaf     send compress(local)                            (leaf)
//   kSendPending  send the bytes a kRecvDAR produced earlier       (middle, send side)
//   kSendFinal    send the block's final bytes unchanged           (all-gather forward)
//   kRecvDA       acc <- local + decompress(msg)                   (inner node, not last parent)
//   kRecvDAR      pending <- compress(local + decompress(msg))     (middle hop, fused)
//   kRecvSink     final <- compress(local + decompress(msg)); output <- decompress(final)
//   kLocalSink    final <- compress(local); output <- decompress(final)   (world of one)
//   kRecvFinal    final <- msg; output <- decompress(final)        (all-gather receive)
//   kLocalFinal   final <- compress(local); output left alone      (all-gather: own shard)
// The sink decompresses its own final bytes, so every rank ends with the same values.
//
// A reduce-scatter runs the reduce phase of a topology alone: chunk c is
// shard c of the input and its sink is rank c, which decodes its output from
// what it receives. An all-gather runs the all-gather phase alone: rank c's
// shard is compressed once (kLocalFinal) and its final bytes are forwarded
// unchanged. Butterfly on a world that is not a power of two, p = the largest
// power of two below it: core rank g < p serves the chunks g and g + p (when
// g + p < n) in the halving or doubling steps; an extra rank e >= p sends its
// part of every other chunk straight to that chunk's core rank (reduce-scatter:
// added before the last halving step) and gets chunk e's partial sum from
// core rank e - p to finish as its sink; in an all-gather it sends its shard
// to e - p before the doubling steps and gets every other shard from its core
// rank after them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/codec.h"
#include "hook/collective/config.h"

namespace dynamiq {

enum class Role : uint8_t {
  kSendLeaf,
  kSendPending,
  kSendFinal,
  kRecvDA,
  kRecvDAR,
  kRecvSink,
  kLocalSink,
  kRecvFinal,
  kLocalFinal,
};

inline bool is_send(Role r) {
  return r == Role::kSendLeaf || r == Role::kSendPending || r == Role::kSendFinal;
}
inline bool is_recv(Role r) {
  return r == Role::kRecvDA || r == Role::kRecvDAR || r == Role::kRecvSink || r == Role::kRecvFinal;
}
const char* role_name(Role r);

struct Op {
  Role role;
  int32_t block;  // index into the block table
  int32_t peer;   // -1 for local ops
  uint32_t tag;   // same on both ends of a message
  // A send whose step also receives: the next op is that receive. Backends
  // that run a rank's operations in posting order (NCCL) get the two posted
  // as one group, so that every rank's k-th step meets its peers' k-th step.
  bool with_recv = false;
  // The next op goes in the same group as this one on backends that run
  // operations in posting order: a schedule joins the ops of one step and
  // block (every chunk and peer it sends to or receives from there), which
  // need nothing received in that group, so such a backend runs them in one
  // round instead of one round each (NCCL: one kernel, not one after another
  // on the stream). Both ends of every message see matching joins (the
  // schedules are symmetric and the block table is shared), so the groups
  // still meet.
  bool group_next = false;
};

struct Program {
  std::vector<Op> ops;
};

// Number of chunks the plan must have for a topology on `world` ranks (the
// registry entry's `chunks`: for an all-reduce on a butterfly the largest power
// of two <= world; else world; for a reduce-scatter or all-gather chunk c is
// shard c).
int topology_chunks(Topology t, int world, Collective kind = Collective::kAllReduce);

// Cuts every chunk of the plan into the same number of blocks of about
// `block_bytes` wire bytes each (at unit boundaries; blocks may be empty when
// a chunk is small). Block id = chunk * blocks_per_chunk + j.
struct BlockTable {
  int blocks_per_chunk = 1;
  std::vector<Block> blocks;
};
BlockTable make_blocks(const Plan& plan, int64_t block_bytes);

// What a schedule function adds one rank's ops with. Chunk c's block j is
// block id c * B + j of the block table; an op on an empty block is left out
// (add returns false). Every message tag must lie below the topology's
// declared tag space (TopologyDef::tag_steps x C x B), checked op by op.
struct ScheduleBuilder {
  ScheduleBuilder(const BlockTable& t, int64_t tag_space, const char* topology);

  const BlockTable& bt;
  const int B;  // blocks per chunk
  const int C;  // chunks

  bool empty(int chunk, int j) const { return bt.blocks[size_t(chunk * B + j)].empty(); }
  // One op (peer -1 for a local op, whose tag is ignored).
  bool add(Role r, int chunk, int j, int peer, int64_t tag);
  // One step of a rank: a send and a receive (either omitted when its block is
  // empty); both present: the send is marked with_recv.
  void step(Role sr, int sc, int sj, int speer, int64_t stag, Role rr, int rc, int rj, int rpeer, int64_t rtag);
  // The ops that add_ops() adds go in one group (Op::group_next).
  template <typename F>
  void grouped(F&& add_ops) {
    const size_t m = prog_.ops.size();
    add_ops();
    for (size_t i = m; i + 1 < prog_.ops.size(); ++i) prog_.ops[i].group_next = true;
  }
  // The usual tag: (step, chunk, block) numbered in that order, below
  // steps x C x B for steps 0 .. steps-1.
  int64_t tag(int step, int chunk, int j) const { return (int64_t(step) * C + chunk) * B + j; }
  // A world of one: every block of chunk 0 is this rank's own (kLocalSink;
  // kLocalFinal for an all-gather).
  void world_of_one(Collective kind);
  Program take() { return std::move(prog_); }

 private:
  Program prog_;
  int64_t tag_space_;
  const char* topology_;
};

// The schedule of `rank` for a topology and collective (the registry entry's
// schedule function). Throws Error for a topology that is not a registered
// schedule for `kind`, and for a tag space over 2^30 (the same on every rank).
Program make_program(Topology t, int rank, int world, const BlockTable& bt,
                     Collective kind = Collective::kAllReduce);

// Recursive halving of the ranges [0, p) for core rank r < p = 2^k over k
// steps: keep[t] is the range r keeps after step t, sent[t] the half it sends
// away at step t; r ends keeping [r, r + 1) (the butterfly schedules).
using RangeList = std::vector<std::pair<int, int>>;
std::pair<RangeList, RangeList> halving_ranges(int r, int p, int k);

// A program as text, one op per line (role, block, peer, tag; tests).
std::string describe_program(const Program& p);

}  // namespace dynamiq
