#include "hook/collective/recv_window.h"

namespace dynamiq {

void ReceiveWindow::post_at(size_t idx) {
  const Op& op = env_.op(idx);
  const Block& b = env_.block(op);
  // Final bytes that are the result itself go straight into the bucket. Safe
  // to post early: they can only arrive after this rank's own contribution
  // to the block (read from that same memory) has been delivered.
  uint8_t* view = op.role == Role::kRecvFinal ? env_.codec.output_view(env_.args.out, env_.plan, b) : nullptr;
  PostedRecv pr;
  pr.op = idx;
  pr.static_bytes = env_.codec.static_bytes(env_.plan, b);
  pr.one_part = env_.one_part(b);
  DQ_CHECK(!(view && pr.one_part), "executor: an output view for a two-part message");
  pr.buf = view ? BufferPool::view(view, 0) : env_.pool.get(env_.max_message_bytes(b));
  const size_t bytes = pr.one_part ? env_.max_message_bytes(b) : pr.static_bytes;
  pr.req = env_.irecv(op, pr.buf->data(), bytes, op.tag, &pr.tl_event);
  inflight_ += int64_t(pr.buf->capacity);
  posted_.push_back(std::move(pr));
}

void ReceiveWindow::post_upto(size_t must_include) {
  const auto& ops = env_.prog.ops;
  for (; next_ < ops.size(); ++next_) {
    if (!is_recv(ops[next_].role)) continue;
    if (next_ > must_include && (env_.ordered || inflight_ >= env_.args.window_bytes)) break;
    post_at(next_);
  }
}

void ReceiveWindow::post_next() { post_at(next_++); }

void ReceiveWindow::expect_front(size_t op) const {
  DQ_CHECK(!posted_.empty() && posted_.front().op == op, "executor: receive order broken");
}

PostedRecv ReceiveWindow::pop_front() {
  PostedRecv pr = std::move(posted_.front());
  posted_.pop_front();
  inflight_ -= int64_t(pr.buf->capacity);
  return pr;
}

void ReceiveWindow::wait_first_part(PostedRecv& r) {
  if (r.first_part_done) return;
  mark_wait_start(r.tl_event);
  env_.timer.wait(*r.req);
  const Block& b = env_.block(env_.op(r.op));
  r.dyn = env_.codec.dynamic_bytes(r.buf->data(), env_.plan, b);
  if (r.dyn > env_.codec.max_dynamic_bytes(env_.plan, b))
    throw MalformedMessage(env_.codec.name() + ": dynamic part larger than its bound");
  r.first_part_done = true;
}

void ReceiveWindow::post_second_part(PostedRecv& r) {
  if (r.dyn == 0 || r.one_part) return;
  const Op& op = env_.op(r.op);
  r.dreq = env_.irecv(op, r.buf->data() + r.static_bytes, r.dyn, op.tag | kDynamicTagBit, &r.tl_devent);
}

void ReceiveWindow::wait_second_part(PostedRecv& r) {
  if (!r.dreq) return;
  mark_wait_start(r.tl_devent);
  env_.timer.wait(*r.dreq);
}

void ReceiveWindow::mark_wait_start(int64_t ev) {
  TimelineRecorder* tl = env_.timer.timeline();
  if (tl && ev >= 0 && tl->event(size_t(ev)).t_need < 0.0) tl->event(size_t(ev)).t_need = timeline_now();
}

void ReceiveWindow::park() {
  for (auto& r : posted_) {
    keep_forever(r.req.release());
    if (r.dreq) keep_forever(r.dreq.release());
    keep_forever(r.buf);
  }
  posted_.clear();
}

}  // namespace dynamiq
