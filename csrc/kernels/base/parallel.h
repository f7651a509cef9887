// Splitting a codec call's units (DynamiQ super-groups, bitsplit units) over
// CPU threads.
//
// Every unit's output depends only on its own inputs and on the
// (key, counter) of its random numbers, and every unit's place in the output
// is known in advance (fixed-size formats), so any assignment of units to
// threads gives bit-identical results. The threads therefore share the units
// dynamically: each claims the next run of `grain` units until none is left.
// Units cost different amounts (a DynamiQ 8-bit super-group about twice a
// 2-bit one, and a plan groups them by width), and a helper may start late
// or be descheduled on a busy machine: a thread that is slower for any
// reason simply takes fewer runs. (An equal split by unit count left one
// thread with most of the 8-bit super-groups.)
//
// Thread count: process-wide, default 1 (a DDP job usually runs one process
// per core or per GPU, and torchrun sets OMP_NUM_THREADS=1 for the same
// reason). DYNAMIQ_CPU_THREADS=N in the environment or dynamiq_set_cpu_threads
// (Python: dynamiq.set_cpu_threads) raise it. Calls made while another call
// holds the helper threads run on the calling thread alone (no waiting).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace dynamiq {

// Threads a codec call may use (>= 1).
int dynamiq_cpu_threads();
// Sets it (1..256); returns the previous value. Throws Error outside that range.
int dynamiq_set_cpu_threads(int n);

// The runs of units one thread works through during parallel_units.
class UnitRuns {
 public:
  struct Queue {
    int64_t w1 = 0, grain = 1;
    std::atomic<int64_t> next{0};
    std::atomic<bool> stop{false};  // a part threw: hand out no more runs
  };
  explicit UnitRuns(Queue& q) : q_(&q) {}
  // Claims the next run [u0, u1) that no thread has taken; false when none is
  // left (or another thread's part has thrown).
  bool next(int64_t& u0, int64_t& u1);

 private:
  Queue* q_;
};

// Calls part(runs) once on each of up to dynamiq_cpu_threads() threads (the
// caller included), at most one thread per min_units units; the threads claim
// runs of [w0, w1) in increasing order until all are taken: runs of `grain`
// units, or shorter where that gives each thread fewer than 8 runs.
// On one thread the only run is [w0, w1). Returns after every part has
// finished; an exception thrown by any part stops the hand-out of runs and is
// rethrown here (the first one).
void parallel_units(int64_t w0, int64_t w1, int64_t min_units, int64_t grain,
                    const std::function<void(UnitRuns&)>& part);

}  // namespace dynamiq
