// What the parts of one execute() call share (executor.cc, recv_window.cc,
// send_window.cc): its inputs, the transport's posting rules, the buffer pool,
// and the stats it adds to with their timer. Internal to the executor.
#pragma once

#include <chrono>
#include <cstddef>

#include "hook/collective/buffer_pool.h"
#include "hook/collective/executor.h"

namespace dynamiq {

// Times the executor's phases into ExecStats: codec kernels, transport posts,
// waits on the network. Every timed span of an execute() goes through here, so
// a per-operation timeline would record its spans here too.
class PhaseTimer {
 public:
  explicit PhaseTimer(ExecStats& st) : st_(st) {}
  template <class F>
  void kernel(F&& fn) { time(st_.t_kernel, fn); }
  template <class F>
  void post(F&& fn) { time(st_.t_post, fn); }
  void wait(Request& r) { time(st_.t_wait, [&] { r.wait(); }); }

 private:
  template <class F>
  static void time(double& total, F&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ExecStats& st_;
};

struct ExecEnv {
  ExecEnv(Transport& tr, const Codec& codec, const Plan& plan, const BlockTable& bt, const Program& prog,
          const ExecArgs& args, const Memory& memory, BufferPool& pool, ExecStats& st)
      : tr(tr), codec(codec), plan(plan), bt(bt), prog(prog), args(args), memory(memory), pool(pool), st(st),
        timer(st),
        ordered(tr.posts_in_order()), one_part_transport(tr.sends_whole_messages()) {}

  Transport& tr;
  const Codec& codec;
  const Plan& plan;
  const BlockTable& bt;
  const Program& prog;
  const ExecArgs& args;
  const Memory& memory;  // where buffers live (args.memory, or the host's)
  BufferPool& pool;      // the calling thread's pool for `memory`
  ExecStats& st;
  PhaseTimer timer;
  // Transports that run operations in posting order (NCCL: no tags; one
  // stream per rank, or per pair of ranks) get receives in program order only
  // and each step's send and receive in one group (Executor::paired_recv; and
  // the ops a schedule joins with Op::group_next, see JoinedGroup), so the
  // ranks' operations meet in the same order on every rank (InprocWorld's
  // nccl_stream_deadlock and nccl_order_violations check both models). Other
  // transports post receives ahead.
  const bool ordered;
  // Two-part messages travel as one where the transport allows (Gloo).
  const bool one_part_transport;

  const Op& op(size_t i) const { return prog.ops[i]; }
  const Block& block(const Op& o) const { return bt.blocks[size_t(o.block)]; }
  size_t static_bytes(const Op& o) const { return codec.static_bytes(plan, block(o)); }
  size_t max_message_bytes(const Block& b) const { return codec.max_message_bytes(plan, b); }
  // Whether block b's message travels as one (both ends decide alike from the block).
  bool one_part(const Block& b) const { return one_part_transport && codec.max_dynamic_bytes(plan, b) > 0; }
};

}  // namespace dynamiq
