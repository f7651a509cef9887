// Message buffers of the executor, and memory parked after a failure.
//
// Block messages are all about the same size, and a fresh allocation per
// message costs an mmap, page faults and munmap (on a 16 MB fp32 bucket that
// was slower than the transfer itself), so buffers live in a per-thread pool
// per Memory that persists across collectives (each group's collectives run
// on one worker thread). Memory is not zero-filled.
//
// What a pool keeps: after each collective, at most the largest number of
// bytes any of the last kPeakWindow collectives had in use at once (and never
// more than kMaxRetained). A collective holds about its rank's share of the
// bucket (final bytes kept for the all-gather) plus the receive window, and
// DDP's first step all-reduces the whole model as one bucket: without the
// window the pool would keep that step's working set for the rest of the job.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/codec.h"

namespace dynamiq {

// Frees a pool buffer into the Memory it came from.
struct ReleaseTo {
  const Memory* memory = nullptr;
  void operator()(uint8_t* p) const { memory->release(p); }
};

class BufferPool {
 public:
  struct Buf {
    std::unique_ptr<uint8_t, ReleaseTo> mem;
    size_t capacity = 0;
    size_t requested = 0;     // what the current user asked for (<= capacity)
    size_t size = 0;          // bytes in use
    uint8_t* ext = nullptr;   // set: a view of memory the pool does not own (the bucket)
    uint8_t* data() { return ext ? ext : mem.get(); }
  };
  // Returns its buffer to the pool when the last reference goes.
  using Ptr = std::shared_ptr<Buf>;

  explicit BufferPool(const Memory& memory) : memory_(memory) {}

  // A buffer over caller memory (zero-copy into/out of the bucket).
  static Ptr view(uint8_t* p, size_t size);
  // A buffer of at least `capacity` bytes: the smallest free one that is large
  // enough, else a new one.
  Ptr get(size_t capacity);

  // Around each collective (see the file comment). Peaks count requested
  // bytes, not the capacity of the buffers handed out: a small request served
  // by a large free buffer must not keep that buffer alive.
  void begin_call() { call_peak_ = requested_; }
  void end_call();
  // Bytes kept for reuse plus bytes in use.
  size_t bytes() const { return retained_ + in_use_; }

 private:
  std::unique_ptr<Buf> take_best_fit(size_t capacity);
  void put(Buf* p);

  static constexpr size_t kMaxRetained = size_t(1) << 30;
  static constexpr size_t kPeakWindow = 16;
  const Memory& memory_;
  std::vector<std::unique_ptr<Buf>> free_;
  size_t retained_ = 0;    // bytes in free_
  size_t in_use_ = 0;      // bytes handed out and not yet back
  size_t requested_ = 0;   // what their users asked for
  size_t call_peak_ = 0;
  std::array<size_t, kPeakWindow> peaks_{};
  size_t next_peak_ = 0;
};

// The calling thread's pool for `memory` (freed when the thread exits).
BufferPool& thread_buffer_pool(const Memory& memory);

// After a failure, buffers returned to the pool later must not be reused or
// freed either (a receive posted into one may still be written): parks the
// calling thread's pool for `memory` (kept reachable, never freed) and starts
// a new one.
void park_thread_buffer_pool(const Memory& memory);

// One collective's use of the calling thread's pool: begin_call now,
// end_call when it goes out of scope, unless the pool was parked meanwhile.
// Declare it before every local that holds pool buffers, so that it ends after
// they are back.
class PoolCall {
 public:
  explicit PoolCall(const Memory& memory);
  ~PoolCall();
  PoolCall(const PoolCall&) = delete;
  PoolCall& operator=(const PoolCall&) = delete;
  BufferPool& pool() const { return pool_; }

 private:
  const Memory& memory_;
  BufferPool& pool_;
};

// Bytes of message buffers the calling thread's pool for `memory` (null:
// host) holds now: kept for reuse plus in use.
size_t executor_pool_bytes(const Memory* memory = nullptr);

// Keeps `p` alive until the process exits. After a failed collective the
// backend may still write into receives posted earlier (Gloo writes a posted
// receive whenever its message arrives, waited on or not), so memory they
// point at must never be freed or reused: execute() parks its own buffers and
// requests; callers park what they own that a receive may point at.
void keep_forever(std::shared_ptr<void> p);
// The same for an object whose ownership the caller gives up (never deleted).
inline void keep_forever(void* p) { keep_forever(std::shared_ptr<void>(p, [](void*) {})); }

}  // namespace dynamiq
