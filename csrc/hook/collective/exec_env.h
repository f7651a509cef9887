// What the parts of one execute() call share (executor.cc, recv_window.cc,
// send_window.cc): its inputs, the transport's posting rules, the buffer pool,
// and the stats it adds to with their timer. Internal to the executor.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>

#include "hook/collective/buffer_pool.h"
#include "hook/collective/executor.h"
#include "hook/collective/timeline.h"

namespace dynamiq {

// Times the executor's phases into ExecStats: codec kernels, transport posts,
// waits on the network; and, with a timeline (ExecArgs::timeline), records
// each kernel, send and receive there (timeline.h).
class PhaseTimer {
 public:
  PhaseTimer(ExecStats& st, TimelineRecorder* tl) : st_(st), tl_(tl) {}
  // A codec call `name` for op `op` (program index; its block).
  template <class F>
  void kernel(const char* name, int32_t op, int32_t block, F&& fn) {
    if (!tl_) {
      time(st_.t_kernel, fn);
      return;
    }
    TimelineEvent e;
    e.kind = TimelineEvent::Kind::kKernel;
    e.name = name;
    e.op = op;
    e.block = block;
    e.t_post = e.t_start = timeline_now();
    fn();
    e.t_end = timeline_now();
    st_.t_kernel += e.t_end - e.t_start;
    tl_->add(e);
  }
  template <class F>
  void post(F&& fn) { time(st_.t_post, fn); }
  void wait(Request& r) { time(st_.t_wait, [&] { r.wait(); }); }
  TimelineRecorder* timeline() const { return tl_; }

 private:
  template <class F>
  static void time(double& total, F&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ExecStats& st_;
  TimelineRecorder* tl_;
};

struct ExecEnv {
  ExecEnv(Transport& tr, const Codec& codec, const Plan& plan, const BlockTable& bt, const Program& prog,
          const ExecArgs& args, const Memory& memory, BufferPool& pool, ExecStats& st, TimelineRecorder* recorder)
      : tr(tr), codec(codec), plan(plan), bt(bt), prog(prog), args(args), memory(memory), pool(pool), st(st),
        timer(st, recorder),
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
  // Program index of an op of the program (-1 for a copy of one).
  int32_t index_of(const Op& o) const {
    const std::less<const Op*> lt;
    const Op* b = prog.ops.data();
    return !lt(&o, b) && lt(&o, b + prog.ops.size()) ? int32_t(&o - b) : -1;
  }
  // Posts a send / receive of op `o` (timed; recorded in the timeline, whose
  // event index goes to *ev when asked).
  std::unique_ptr<Request> isend(const Op& o, const void* data, size_t bytes, uint32_t tag) {
    return post(o, true, const_cast<void*>(data), bytes, tag, nullptr);
  }
  std::unique_ptr<Request> irecv(const Op& o, void* data, size_t bytes, uint32_t tag, int64_t* ev = nullptr) {
    return post(o, false, data, bytes, tag, ev);
  }
  const Block& block(const Op& o) const { return bt.blocks[size_t(o.block)]; }
  size_t static_bytes(const Op& o) const { return codec.static_bytes(plan, block(o)); }
  size_t max_message_bytes(const Block& b) const { return codec.max_message_bytes(plan, b); }
  // Whether block b's message travels as one (both ends decide alike from the block).
  bool one_part(const Block& b) const { return one_part_transport && codec.max_dynamic_bytes(plan, b) > 0; }

 private:
  std::unique_ptr<Request> post(const Op& o, bool send, void* data, size_t bytes, uint32_t tag, int64_t* ev) {
    std::unique_ptr<Request> r;
    TimelineRecorder* tl = timer.timeline();
    const double t0 = tl ? timeline_now() : 0.0;
    timer.post([&] { r = send ? tr.isend(data, bytes, o.peer, tag) : tr.irecv(data, bytes, o.peer, tag); });
    if (!tl) return r;
    TimelineEvent e;
    e.kind = send ? TimelineEvent::Kind::kSend : TimelineEvent::Kind::kRecv;
    e.name = role_name(o.role);
    e.op = index_of(o);
    e.block = o.block;
    e.peer = o.peer;
    e.tag = tag;
    e.bytes = int64_t(bytes);
    e.t_post = e.t_start = t0;
    const size_t i = tl->add(e);
    if (ev) *ev = int64_t(i);
    return tl->watch(std::move(r), i, o.peer, send);
  }
};

}  // namespace dynamiq
