// The executor's sends in flight. Send buffers go back to the pool once their
// sends complete, and at most ExecArgs::window_bytes of them stay in flight
// (see reap); sends straight from the bucket (zero-copy) are waited for before
// the bucket's bytes there are overwritten (wait_zero_copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hook/collective/exec_env.h"

namespace dynamiq {

class SendWindow {
 public:
  explicit SendWindow(ExecEnv& env) : env_(env), zero_copy_pending_(env.bt.blocks.size(), 0) {}

  bool empty() const { return sends_.empty(); }
  // Posts op's whole message, buf[0, buf->size).
  void send_whole(const Op& op, const BufferPool::Ptr& buf) { post(op, buf, 0, buf->size, op.tag); }
  // Posts the first part of op's message, buf[0, static_bytes).
  void send_static_part(const Op& op, const BufferPool::Ptr& buf, size_t static_bytes) {
    post(op, buf, 0, static_bytes, op.tag);
  }
  // Posts the second part of op's message, buf[static_bytes, buf->size), if it has one.
  void send_dynamic_part(const Op& op, const BufferPool::Ptr& buf, size_t static_bytes);
  // Posts op's message straight from the bucket's bytes `data` (zero-copy).
  void send_view(const Op& op, const uint8_t* data, size_t bytes);

  // Before a block's part of the bucket is overwritten with results: waits
  // for its zero-copy sends.
  void wait_zero_copy(int32_t block);
  // Drops completed sends, then waits on the oldest while the buffers of
  // unfinished sends exceed the window; never on a send posted ahead of op
  // `current` (Executor::send_ahead: see reap's comment).
  void reap(size_t current);
  // Pool bytes held by unfinished sends.
  size_t held_bytes() const { return held_; }
  // Waits for every send.
  void wait_all();
  // After a failure: parks every send's request and buffer forever.
  void park();

 private:
  struct PendingSend {
    std::unique_ptr<Request> req;
    BufferPool::Ptr buf;  // keeps the bytes alive until the send completes (null: zero-copy from the bucket)
    int32_t zero_copy_block = -1;
    int64_t op = -1;  // program index of the op (-1: a copy of one, posted in program order)
    size_t held_bytes() const { return buf ? buf->capacity : 0; }
  };
  void post(const Op& op, const BufferPool::Ptr& buf, size_t offset, size_t bytes, uint32_t tag);
  void push(PendingSend&& s);
  void drop_completed();

  ExecEnv& env_;
  std::vector<PendingSend> sends_;
  size_t held_ = 0;  // pool bytes held by sends_
  // Blocks whose bucket memory is being sent without a copy: written only after the send completes.
  std::vector<uint8_t> zero_copy_pending_;
};

}  // namespace dynamiq
