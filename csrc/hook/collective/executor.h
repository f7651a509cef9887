// Runs one rank's schedule: posts receives ahead (up to a byte window), runs
// the codec kernel of each op as its message arrives, and posts each send as
// soon as its bytes exist. With blocks smaller than chunks this pipelines the
// collective: the receive of block k+1 is in flight while the fused kernel
// runs on block k and the send of block k-1 drains.
#pragma once

#include <memory>

#include "kernels/codec.h"
#include "hook/collective/schedule.h"
#include "hook/transport/transport.h"

namespace dynamiq {

struct ExecStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t messages_sent = 0;
  double t_kernel = 0.0;  // seconds inside codec kernels
  double t_wait = 0.0;    // seconds blocked waiting for the network
  double t_post = 0.0;    // seconds inside the transport's isend/irecv/test calls
};

struct ExecArgs {
  void* bucket = nullptr;       // the rank's input, overwritten with the result
  Output out;                   // how final values are written (bias add, divisor)
  RngCtx rng;
  int64_t window_bytes = 16 << 20;
  // Where message buffers and the accumulator live (null: host memory); the
  // memory of the codec's pointers (a device's for the CUDA codecs).
  const Memory* memory = nullptr;
};

// Tag bit marking the dynamic part of a two-part message.
constexpr uint32_t kDynamicTagBit = 1u << 30;

void execute(Transport& tr, const Codec& codec, const Plan& plan, const BlockTable& bt,
             const Program& prog, const ExecArgs& args, ExecStats& st);

// Bytes of message buffers the calling thread's pool for `memory` (null: host)
// holds now: kept for reuse plus in use. See BufferPool in executor.cc.
size_t executor_pool_bytes(const Memory* memory = nullptr);

// Keeps `p` alive until the process exits. After a failed collective the
// backend may still write into receives posted earlier (Gloo writes a posted
// receive whenever its message arrives, waited on or not), so memory they
// point at must never be freed or reused: execute() parks its own buffers and
// requests; callers park what they own that a receive may point at.
void keep_forever(std::shared_ptr<void> p);
// The same for an object whose ownership the caller gives up (never deleted).
inline void keep_forever(void* p) { keep_forever(std::shared_ptr<void>(p, [](void*) {})); }

}  // namespace dynamiq
