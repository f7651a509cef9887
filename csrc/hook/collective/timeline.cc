#include "hook/collective/timeline.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <thread>

namespace dynamiq {

const char* timeline_kind_name(TimelineEvent::Kind k) {
  switch (k) {
    case TimelineEvent::Kind::kPhase: return "phase";
    case TimelineEvent::Kind::kKernel: return "kernel";
    case TimelineEvent::Kind::kSend: return "send";
    case TimelineEvent::Kind::kRecv: return "recv";
  }
  return "?";
}

double timeline_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One watched request: whoever claims it first (its watcher, or the executor
// waiting on it) waits on the inner request and records when that returned.
struct TimelineRecorder::Watched {
  std::unique_ptr<Request> inner;
  size_t ev = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool claimed = false, done = false, exact = false;
  std::exception_ptr error;
  double t_end = 0.0;

  // Waits on the inner request unless another thread has claimed it.
  void complete() {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (claimed) return;
      claimed = true;
    }
    const double t0 = timeline_now();
    std::exception_ptr err;
    try {
      inner->wait();
    } catch (...) {
      err = std::current_exception();
    }
    const double t1 = timeline_now();
    {
      std::lock_guard<std::mutex> lk(mu);
      done = true;
      t_end = t1;
      exact = t1 - t0 > 50e-6;  // the wait blocked: the request completed during it
      error = err;
    }
    cv.notify_all();
  }
  void wait_done() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }
};

// A thread per peer and direction that completes its requests in posting order.
struct TimelineRecorder::Watcher {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Watched>> queue;
  bool closed = false;
  std::thread thread;

  static void loop(const std::shared_ptr<Watcher>& self) {
    for (;;) {
      std::shared_ptr<Watched> w;
      {
        std::unique_lock<std::mutex> lk(self->mu);
        self->cv.wait(lk, [&] { return self->closed || !self->queue.empty(); });
        if (self->queue.empty()) return;
        w = std::move(self->queue.front());
        self->queue.pop_front();
      }
      w->complete();
    }
  }
  void push(std::shared_ptr<Watched> w) {
    {
      std::lock_guard<std::mutex> lk(mu);
      queue.push_back(std::move(w));
    }
    cv.notify_one();
  }
  void close() {
    {
      std::lock_guard<std::mutex> lk(mu);
      closed = true;
    }
    cv.notify_one();
  }
};

namespace {

class WatchedRequest final : public Request {
 public:
  explicit WatchedRequest(std::shared_ptr<TimelineRecorder::Watched> w) : w_(std::move(w)) {}
  void wait() override {
    w_->complete();
    w_->wait_done();
  }
  bool test() override {
    std::lock_guard<std::mutex> lk(w_->mu);
    if (!w_->done) return false;
    if (w_->error) std::rethrow_exception(w_->error);
    return true;
  }

 private:
  std::shared_ptr<TimelineRecorder::Watched> w_;
};

}  // namespace

TimelineRecorder::TimelineRecorder(Timeline& tl, int32_t slice, const char* part)
    : tl_(tl), slice_(slice), part_(part) {}

TimelineRecorder::~TimelineRecorder() {
  if (finished_) return;
  // A failure: requests may never complete. The watchers end once their
  // queues are done (or never); they own what they touch.
  for (auto& w : watchers_) {
    w->close();
    if (w->thread.joinable()) w->thread.detach();
  }
}

size_t TimelineRecorder::add(const TimelineEvent& e) {
  tl_.events.push_back(e);
  tl_.events.back().slice = slice_;
  tl_.events.back().part = part_;
  return tl_.events.size() - 1;
}

std::unique_ptr<Request> TimelineRecorder::watch(std::unique_ptr<Request> r, size_t ev, int peer, bool send) {
  auto w = std::make_shared<Watched>();
  w->inner = std::move(r);
  w->ev = ev;
  const size_t key = size_t(peer) * 2 + (send ? 1 : 0);
  std::shared_ptr<Watcher>* slot = nullptr;
  for (size_t k = 0; k < watcher_keys_.size(); ++k)
    if (watcher_keys_[k] == key) slot = &watchers_[k];
  if (!slot) {
    auto nw = std::make_shared<Watcher>();
    nw->thread = std::thread(Watcher::loop, nw);
    watchers_.push_back(std::move(nw));
    watcher_keys_.push_back(key);
    slot = &watchers_.back();
  }
  (*slot)->push(w);
  watched_.push_back(w);
  return std::make_unique<WatchedRequest>(std::move(w));
}

void TimelineRecorder::finish() {
  for (auto& w : watchers_) {
    w->close();
    w->thread.join();
  }
  finished_ = true;
  for (auto& w : watched_) {
    std::lock_guard<std::mutex> lk(w->mu);
    if (!w->done) continue;
    TimelineEvent& e = tl_.events[w->ev];
    e.t_end = w->t_end;
    e.exact = w->exact;
  }
  watched_.clear();
  watchers_.clear();
  watcher_keys_.clear();
}

}  // namespace dynamiq
