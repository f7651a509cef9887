#include "hook/collective/buffer_pool.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

namespace dynamiq {

BufferPool::Ptr BufferPool::view(uint8_t* p, size_t size) {
  auto* b = new Buf();
  b->ext = p;
  b->size = size;
  return Ptr(b);
}

std::unique_ptr<BufferPool::Buf> BufferPool::take_best_fit(size_t capacity) {
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i]->capacity >= capacity && (best == free_.size() || free_[i]->capacity < free_[best]->capacity))
      best = i;
  if (best == free_.size()) return nullptr;
  std::unique_ptr<Buf> b = std::move(free_[best]);
  free_[best] = std::move(free_.back());
  free_.pop_back();
  retained_ -= b->capacity;
  return b;
}

BufferPool::Ptr BufferPool::get(size_t capacity) {
  std::unique_ptr<Buf> b = take_best_fit(capacity);
  if (!b) {
    b = std::make_unique<Buf>();
    b->mem = std::unique_ptr<uint8_t, ReleaseTo>(static_cast<uint8_t*>(memory_.allocate(capacity)),
                                                 ReleaseTo{&memory_});
    b->capacity = capacity;
  }
  b->size = 0;
  b->requested = capacity;
  in_use_ += b->capacity;
  requested_ += capacity;
  call_peak_ = std::max(call_peak_, requested_);
  return Ptr(b.release(), [this](Buf* p) { put(p); });
}

void BufferPool::end_call() {
  peaks_[next_peak_++ % kPeakWindow] = call_peak_;
  size_t keep = 0;
  for (size_t p : peaks_) keep = std::max(keep, p);
  keep = keep > in_use_ ? keep - in_use_ : 0;
  // largest first (they are the ones a smaller working set does not need), and
  // not below `keep`
  std::sort(free_.begin(), free_.end(), [](const auto& a, const auto& b) { return a->capacity > b->capacity; });
  bool freed = false;
  while (!free_.empty() && retained_ - free_.front()->capacity >= keep) {
    retained_ -= free_.front()->capacity;
    free_.erase(free_.begin());
    freed = true;
  }
  if (freed) memory_.trim();  // a device pool keeps freed memory until told
}

void BufferPool::put(Buf* p) {
  std::unique_ptr<Buf> b(p);
  in_use_ -= b->capacity;
  requested_ -= b->requested;
  if (retained_ + b->capacity > kMaxRetained) {  // freed
    b.reset();
    memory_.trim();
    return;
  }
  retained_ += b->capacity;
  free_.push_back(std::move(b));
}

namespace {

// The calling thread's pool slot for `memory` in its current domain.
std::unique_ptr<BufferPool>& thread_pool_slot(const Memory& memory) {
  thread_local std::map<std::pair<const Memory*, int>, std::unique_ptr<BufferPool>> pools;
  std::unique_ptr<BufferPool>& pool = pools[{&memory, memory.domain()}];
  if (!pool) pool = std::make_unique<BufferPool>(memory);
  return pool;
}

}  // namespace

BufferPool& thread_buffer_pool(const Memory& memory) { return *thread_pool_slot(memory); }

void park_thread_buffer_pool(const Memory& memory) {
  std::unique_ptr<BufferPool>& slot = thread_pool_slot(memory);
  keep_forever(slot.release());
  slot = std::make_unique<BufferPool>(memory);
}

PoolCall::PoolCall(const Memory& memory) : memory_(memory), pool_(thread_buffer_pool(memory)) { pool_.begin_call(); }

PoolCall::~PoolCall() {
  if (&thread_buffer_pool(memory_) == &pool_) pool_.end_call();  // not a pool parked on failure
}

size_t executor_pool_bytes(const Memory* memory) {
  return thread_buffer_pool(memory ? *memory : host_memory()).bytes();
}

void keep_forever(std::shared_ptr<void> p) {
  if (!p) return;
  static std::mutex mu;
  static auto* graveyard = new std::vector<std::shared_ptr<void>>();  // never freed
  std::lock_guard<std::mutex> lk(mu);
  graveyard->push_back(std::move(p));
}

}  // namespace dynamiq
