// Splitting a codec call's units (DynamiQ super-groups, bitsplit units) over
// CPU threads.
//
// Every unit's output depends only on its own inputs and on the
// (key, counter) of its random numbers, so any split gives bit-identical
// results; each part starts at a wire offset known in advance (fixed-size
// formats). The split is contiguous and deterministic: part t of T gets
// units [w0 + (n*t)/T, w0 + (n*(t+1))/T).
//
// Thread count: process-wide, default 1 (a DDP job usually runs one process
// per core or per GPU, and torchrun sets OMP_NUM_THREADS=1 for the same
// reason). DYNAMIQ_CPU_THREADS=N in the environment or dynamiq_set_cpu_threads
// (Python: dynamiq.set_cpu_threads) raise it. Calls made while another call
// holds the helper threads run on the calling thread alone (no waiting).
#pragma once

#include <cstdint>
#include <functional>

namespace dynamiq {

// Threads a codec call may use (>= 1).
int dynamiq_cpu_threads();
// Sets it (1..256); returns the previous value. Throws Error outside that range.
int dynamiq_set_cpu_threads(int n);

// Calls fn(u0, u1) for contiguous parts of [w0, w1) on up to
// dynamiq_cpu_threads() threads (the caller runs part 0), with at least
// min_units units per part; returns after every part has finished. An
// exception thrown by any part is rethrown here (the first one).
void parallel_units(int64_t w0, int64_t w1, int64_t min_units,
                    const std::function<void(int64_t, int64_t)>& fn);

}  // namespace dynamiq
