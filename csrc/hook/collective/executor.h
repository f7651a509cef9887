// Runs one rank's schedule: posts receives ahead (up to a byte window), runs
// the codec kernel of each op as its message arrives, and posts each send as
// soon as its bytes exist, also ahead of its place in the program when the
// executor would otherwise wait for a receive with the wire idle
// (ExecArgs::send_ahead). With blocks smaller than chunks this pipelines the
// collective: the receive of block k+1 is in flight while the fused kernel
// runs on block k and the send of block k+1 is on the wire.
//
// Where things live:
//   buffer_pool.h  message buffers reused across collectives; memory parked after a failure
//   recv_window.h  receives posted ahead of their ops, bounded by window_bytes
//   send_window.h  sends in flight, bounded by window_bytes; zero-copy sends from the bucket
//   executor.cc    the walk over the program: one op at a time, by its Role
// A new collective (another schedule) plugs in as a Program (schedule.h): the
// executor runs any program whose ops use the roles below; a new role is one
// more case in Executor::run_op (a send) or Executor::consume (a receive).
#pragma once

#include <cstdint>

#include "hook/collective/buffer_pool.h"
#include "hook/collective/exec_stats.h"
#include "hook/collective/schedule.h"
#include "hook/collective/timeline.h"
#include "hook/transport/transport.h"
#include "kernels/codec.h"

namespace dynamiq {

struct ExecArgs {
  void* bucket = nullptr;       // the rank's input (all-reduce: overwritten with the result)
  Output out;                   // how final values are written (bias add, divisor)
  RngCtx rng;
  int64_t window_bytes = 16 << 20;
  // Where message buffers and the accumulator live (null: host memory); the
  // memory of the codec's pointers (a device's for the CUDA codecs).
  const Memory* memory = nullptr;
  // Non-null: every kernel, send and receive is recorded there (timeline.h),
  // as part of slice `timeline_slice` of the bucket.
  Timeline* timeline = nullptr;
  int32_t timeline_slice = 0;
  const char* timeline_part = "data";
  // Sends posted ahead of their place in the program (on transports that
  // match by tag), at most this many at a time: before the executor blocks on
  // a receive it posts the next sends whose bytes exist already (a leaf's
  // compress, a pending or final message made earlier), so the wire has the
  // next block while the kernel of this one runs. Same messages, same bytes,
  // another posting order. 0: off; -1: $DYNAMIQ_SEND_AHEAD, else 2.
  int send_ahead = -1;
  // A reduce-scatter in a lossy mode: a kRecvSink writes local + decompress(msg)
  // to the output as it is (Codec::decompress_accumulate_output) instead of
  // compressing that sum and decoding its own bytes. No rank receives a
  // reduce-scatter's final bytes, so that compression would only add its error
  // to the result (the all-reduce needs it: every rank decodes those bytes).
  // Off for exact codecs, whose compression of the sum loses nothing but the
  // rounding to the bucket dtype, which stays where an all-reduce does it.
  bool sink_writes_sum = false;
};

// Tag bit marking the dynamic part of a two-part message.
constexpr uint32_t kDynamicTagBit = 1u << 30;

// Runs `prog` and adds its counts and times to `st`. On failure parks every
// buffer and request a backend may still touch (keep_forever) and rethrows.
void execute(Transport& tr, const Codec& codec, const Plan& plan, const BlockTable& bt,
             const Program& prog, const ExecArgs& args, ExecStats& st);

}  // namespace dynamiq
