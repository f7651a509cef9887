// The executor's receive window: receives posted ahead of the ops that
// consume them, in program order, while the bytes of posted and unconsumed
// receives stay under ExecArgs::window_bytes (and always far enough to
// include the op being run). On an ordered transport (ExecEnv::ordered) only
// as far as the op being run: receives are posted in program order there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>

#include "hook/collective/exec_env.h"

namespace dynamiq {

// One posted receive: the first part of its message (or the whole message,
// see one_part), then, once that has told its size, its second part.
struct PostedRecv {
  size_t op = 0;
  std::unique_ptr<Request> req;
  BufferPool::Ptr buf;
  size_t static_bytes = 0;
  bool one_part = false;  // posted for the whole message (see accepts_shorter_messages)
  bool first_part_done = false;
  size_t dyn = 0;  // bytes of the second part (once first_part_done)
  // The second part's receive, when it was posted before this receive's turn
  // (a joined group's receives on an ordered transport).
  std::unique_ptr<Request> dreq;
  int64_t tl_event = -1, tl_devent = -1;  // their timeline events (timeline.h), -1: none
};

class ReceiveWindow {
 public:
  explicit ReceiveWindow(ExecEnv& env) : env_(env) {}

  // Posts receives in program order until the window is full, but always far
  // enough to include op `must_include`.
  void post_upto(size_t must_include);
  // Posts the next receive of the program now (the receive of a step, in one
  // group with the step's send: Executor::paired_recv).
  void post_next();
  // Op index the next receive is posted for (every receive before it is posted).
  size_t next() const { return next_; }

  size_t size() const { return posted_.size(); }
  PostedRecv& at(size_t k) { return posted_[k]; }
  // Checks that the oldest posted receive is op `op`'s.
  void expect_front(size_t op) const;
  // Removes the oldest posted receive and gives its bytes back to the window.
  PostedRecv pop_front();

  // Waits for a receive's first part and reads the size of its second part.
  void wait_first_part(PostedRecv& r);
  // Posts the receive of r's second part where it travels separately.
  void post_second_part(PostedRecv& r);
  // Waits for r's second part, if it has a receive of its own.
  void wait_second_part(PostedRecv& r);

  // After a failure: parks every posted receive's requests and buffer forever.
  void park();

 private:
  void post_at(size_t idx);
  void mark_wait_start(int64_t ev);

  ExecEnv& env_;
  std::deque<PostedRecv> posted_;
  size_t next_ = 0;        // next op index to consider for posting a receive
  int64_t inflight_ = 0;   // bytes of posted, unconsumed receives
};

}  // namespace dynamiq
