// Topology schedules: for one rank, the ordered list of sends, receives and
// local steps of an all-reduce over blocks, with the kernel role of each.
// Schedules know blocks and peers, never codecs; the executor runs any
// schedule with any codec.
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

// Number of chunks the plan must have for a topology on `world` ranks: for an
// all-reduce on a butterfly the largest power of two <= world; else world
// (for a reduce-scatter or all-gather chunk c is shard c).
int topology_chunks(Topology t, int world, Collective kind = Collective::kAllReduce);

// Cuts every chunk of the plan into the same number of blocks of about
// `block_bytes` wire bytes each (at unit boundaries; blocks may be empty when
// a chunk is small). Block id = chunk * blocks_per_chunk + j.
struct BlockTable {
  int blocks_per_chunk = 1;
  std::vector<Block> blocks;
};
BlockTable make_blocks(const Plan& plan, int64_t block_bytes);

// The schedule of `rank` for a topology and collective. Ops on empty blocks are omitted.
Program make_program(Topology t, int rank, int world, const BlockTable& bt,
                     Collective kind = Collective::kAllReduce);

// Largest tag used by a program shape (for tag-space checks).
std::string describe_program(const Program& p);

}  // namespace dynamiq
