#include "hook/collective/send_window.h"

namespace dynamiq {

void SendWindow::push(PendingSend&& s) {
  held_ += s.held_bytes();
  sends_.push_back(std::move(s));
}

void SendWindow::post(const Op& op, const BufferPool::Ptr& buf, size_t offset, size_t bytes, uint32_t tag) {
  push(PendingSend{env_.isend(op, buf->data() + offset, bytes, tag), buf, -1, env_.index_of(op)});
}

void SendWindow::send_dynamic_part(const Op& op, const BufferPool::Ptr& buf, size_t static_bytes) {
  if (buf->size > static_bytes) post(op, buf, static_bytes, buf->size - static_bytes, op.tag | kDynamicTagBit);
}

void SendWindow::send_view(const Op& op, const uint8_t* data, size_t bytes) {
  push(PendingSend{env_.isend(op, data, bytes, op.tag), nullptr, op.block, env_.index_of(op)});
  zero_copy_pending_[size_t(op.block)] = 1;
}

void SendWindow::wait_zero_copy(int32_t block) {
  if (!zero_copy_pending_[size_t(block)]) return;
  for (auto& s : sends_)
    if (s.zero_copy_block == block) {
      env_.timer.wait(*s.req);
      s.zero_copy_block = -1;
    }
  zero_copy_pending_[size_t(block)] = 0;
}

void SendWindow::drop_completed() {
  size_t k = 0;
  for (size_t i = 0; i < sends_.size(); ++i) {
    if (sends_[i].req->test()) {  // completed: drop request and buffer ref
      held_ -= sends_[i].held_bytes();
      continue;
    }
    if (k != i) sends_[k] = std::move(sends_[i]);
    ++k;
  }
  sends_.resize(k);
}

// Gloo's sends report completion only from wait() (test() stays false), so
// without a bound a collective would hold every message it sent: its whole
// share of the bucket. Hence the send window: while the buffers of unfinished
// sends exceed window_bytes, wait on the oldest. That cannot deadlock: every
// schedule orders each rank's operations by (step, block), a message has the
// same position in its sender's and its receiver's program, and receives are
// posted at least up to the rank's current operation; a rank waiting on a
// send is waiting for a receiver whose position is earlier than that send's,
// so a chain of waiting ranks has strictly decreasing positions and cannot
// close into a cycle. (Checked on every schedule with rendezvous sends in
// tests/cpp/test_send_window.cc.) Sends posted ahead of the rank's current
// op (Executor::send_ahead) are not waited on here: their receivers may be
// waiting for an earlier op of this rank, and the argument needs every send
// waited on to sit at or before the waiting rank's position. They count
// towards the window (send_ahead posts within it) and are waited on once the
// rank has reached them.
void SendWindow::reap(size_t current) {
  env_.timer.post([&] { drop_completed(); });
  for (size_t i = 0; i < sends_.size() && held_ > size_t(env_.args.window_bytes);) {
    if (!sends_[i].buf || sends_[i].op > int64_t(current)) {
      ++i;
      continue;
    }
    env_.timer.wait(*sends_[i].req);
    held_ -= sends_[i].held_bytes();
    sends_.erase(sends_.begin() + std::ptrdiff_t(i));
  }
}

void SendWindow::wait_all() {
  for (auto& s : sends_) env_.timer.wait(*s.req);
  sends_.clear();
  held_ = 0;
}

void SendWindow::park() {
  for (auto& s : sends_) {
    keep_forever(s.req.release());
    keep_forever(s.buf);
  }
  sends_.clear();
  held_ = 0;
}

}  // namespace dynamiq
