#include "kernels/base/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/base/common.h"

namespace dynamiq {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kRunsPerThread = 8;

int threads_from_env() {
  const char* e = std::getenv("DYNAMIQ_CPU_THREADS");
  if (!e || !*e) return 1;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  // A bad value is not worth failing a training job over: fall back to 1, and say so.
  if (end == e || *end != '\0' || v < 1 || v > kMaxThreads) {
    std::fprintf(stderr, "dynamiq: ignoring DYNAMIQ_CPU_THREADS=%s (not an integer in [1, %d]); using 1 thread\n",
                 e, kMaxThreads);
    return 1;
  }
  return int(v);
}

std::atomic<int>& thread_setting() {
  static std::atomic<int> n{threads_from_env()};
  return n;
}

// Fork-join helpers: part 0 of a job runs on the caller, part t (1 <= t <
// parts) on helper t. One job at a time (busy); helpers are started lazily
// and kept for the life of the process.
class Pool {
 public:
  std::mutex busy;

  // Runs part(t) for t in [0, parts); returns when all are done, rethrowing
  // the first exception. Caller holds `busy`.
  void run(int parts, const std::function<void(int)>& part) {
    grow(parts - 1);
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &part;
      parts_ = parts;
      pending_ = parts - 1;
      err_ = nullptr;
      ++gen_;
    }
    cv_.notify_all();
    std::exception_ptr mine;
    try {
      part(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (err_) std::rethrow_exception(err_);
  }

 private:
  void grow(int helpers) {
    while (int(threads_.size()) < helpers) {
      const int id = int(threads_.size()) + 1;
      threads_.emplace_back([this, id] { loop(id); });
      threads_.back().detach();  // lives as long as the process
    }
  }

  void loop(int id) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      if (id >= parts_) continue;
      const std::function<void(int)>* job = job_;
      lk.unlock();
      std::exception_ptr e;
      try {
        (*job)(id);
      } catch (...) {
        e = std::current_exception();
      }
      lk.lock();
      if (e && !err_) err_ = e;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex m_;
  std::condition_variable cv_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0;
  int pending_ = 0;
  uint64_t gen_ = 0;
  std::exception_ptr err_;
};

// The pool of this process: a child made by fork() has none of the parent's
// threads, so it gets a new pool (the old object is left alone, never freed).
Pool& pool() {
  static std::mutex mu;
  static Pool* p = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lk(mu);
  if (!p || owner != getpid()) {
    p = new Pool();
    owner = getpid();
  }
  return *p;
}

}  // namespace

int dynamiq_cpu_threads() { return thread_setting().load(std::memory_order_relaxed); }

int dynamiq_set_cpu_threads(int n) {
  DQ_CHECK(n >= 1 && n <= kMaxThreads, "dynamiq_set_cpu_threads: n must be in [1, " +
                                           std::to_string(kMaxThreads) + "] (got " +
                                           std::to_string(n) + ")");
  return thread_setting().exchange(n);
}

bool UnitRuns::next(int64_t& u0, int64_t& u1) {
  if (q_->stop.load(std::memory_order_relaxed)) return false;
  const int64_t a = q_->next.fetch_add(q_->grain, std::memory_order_relaxed);
  if (a >= q_->w1) return false;
  u0 = a;
  u1 = std::min(a + q_->grain, q_->w1);
  return true;
}

void parallel_units(int64_t w0, int64_t w1, int64_t min_units, int64_t grain,
                    const std::function<void(UnitRuns&)>& part) {
  const int64_t n = w1 - w0;
  if (n <= 0) return;
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(1, min_units));
  const int parts = int(std::min<int64_t>(dynamiq_cpu_threads(), most));
  UnitRuns::Queue q;
  q.w1 = w1;
  q.next = w0;
  q.grain = n;  // one run, unless helpers join
  auto alone = [&] {
    UnitRuns r(q);
    part(r);
  };
  if (parts <= 1) {
    alone();
    return;
  }
  Pool& p = pool();
  std::unique_lock<std::mutex> busy(p.busy, std::try_to_lock);
  if (!busy.owns_lock()) {  // another call has the helpers: do not wait for them
    alone();
    return;
  }
  // at most `grain` units per run, and at least kRunsPerThread runs per thread
  // so that the last runs even out the parts
  q.grain = std::max<int64_t>(1, std::min(grain, n / (int64_t(parts) * kRunsPerThread)));
  p.run(parts, [&](int) {
    UnitRuns r(q);
    try {
      part(r);
    } catch (...) {
      q.stop.store(true, std::memory_order_relaxed);
      throw;
    }
  });
}

}  // namespace dynamiq
