// A per-operation timeline of one all-reduce call, on request
// (CollectiveConfig::timeline; off by default, and then nothing here runs):
// the driver's phases, every codec kernel, and the post, start and end of
// every send and receive of the executor, in seconds of the steady clock
// (CLOCK_MONOTONIC: one clock for every process of a machine, so the ranks'
// timelines line up). experiments/probes/timeline_gantt.py draws it.
//
// What the times mean (post <= start <= end for every event):
//   phase  (local pass, header exchange, metadata all-reduce, plan, execute,
//          the exact path's all-reduce): post = start, end.
//   kernel (one codec call on one block): post = start, end.
//   send   post = start = isend called (its bytes exist); end = the send
//          completed (on Gloo: its bytes were handed to the socket).
//   recv   post = start = irecv called; end = the message was there;
//          need = when the executor began to wait for it (it needed the
//          message then: need < end means the executor was blocked).
// Ends of sends and receives are taken by watcher threads, one per peer and
// direction, that wait on each request in posting order (a wait the executor
// makes itself before a watcher got to the request records the end instead:
// `waited` then says the executor was the one blocked). An end seen by a
// thread that was not blocked on the request is an upper bound (`exact` false).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hook/transport/transport.h"

namespace dynamiq {

struct TimelineEvent {
  enum class Kind : uint8_t { kPhase = 0, kKernel = 1, kSend = 2, kRecv = 3 };
  Kind kind = Kind::kPhase;
  const char* name = "";  // phase or kernel name; sends and receives: the op's role
  int32_t slice = 0;      // slice of the bucket (CollectiveConfig::max_collective_bytes)
  const char* part = "";  // kernels, sends, receives: "data" (the bucket) or "meta" (its statistics)
  int32_t op = -1;        // program op index (-1: not an op)
  int32_t block = -1;
  int32_t peer = -1;
  uint32_t tag = 0;
  int64_t bytes = 0;
  double t_post = 0.0, t_start = 0.0, t_end = 0.0;
  double t_need = -1.0;  // receives: when the executor began to wait for it (-1: not a receive)
  bool exact = true;  // t_end observed by a thread blocked on the request (sends and receives)
};

const char* timeline_kind_name(TimelineEvent::Kind k);

struct Timeline {
  int rank = 0;
  int world = 1;
  std::vector<TimelineEvent> events;
};

// Seconds on the steady clock.
double timeline_now();

// Records one execute() call's sends and receives into a Timeline: wraps each
// posted request so that its completion time is taken (see the file comment).
// finish() joins the watchers and writes the ends into the events; after a
// failure the destructor leaves the watchers running on their own (a request
// may never complete) without touching the events.
class TimelineRecorder {
 public:
  TimelineRecorder(Timeline& tl, int32_t slice, const char* part);
  ~TimelineRecorder();
  TimelineRecorder(const TimelineRecorder&) = delete;
  TimelineRecorder& operator=(const TimelineRecorder&) = delete;

  // Adds an event; returns its index.
  size_t add(const TimelineEvent& e);
  TimelineEvent& event(size_t i) { return tl_.events[i]; }
  int32_t slice() const { return slice_; }
  // A posted send or receive (its event at index `ev`): the request, wrapped.
  std::unique_ptr<Request> watch(std::unique_ptr<Request> r, size_t ev, int peer, bool send);
  // Joins the watchers and writes every end into its event.
  void finish();

  struct Watched;
  struct Watcher;

 private:
  Timeline& tl_;
  const int32_t slice_;
  const char* part_;
  std::vector<std::shared_ptr<Watched>> watched_;
  std::vector<std::shared_ptr<Watcher>> watchers_;  // per (peer, direction)
  std::vector<size_t> watcher_keys_;                 // 2 * peer + (send ? 1 : 0), per watcher
  bool finished_ = false;
};

}  // namespace dynamiq
