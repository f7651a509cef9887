#include "hook/transport/staging_transport.h"

#include <algorithm>

namespace dynamiq {

StagingPool::StagingPool(const HostStaging& staging, size_t keep_bytes) : st_(staging), keep_(keep_bytes) {}

StagingPool::~StagingPool() {
  for (auto& b : bufs_) {
    if (b->in_use) continue;  // (a request still holds it: it abandons it when dropped)
    st_.wait(b->mark);
    st_.free_mark(b->mark);
    st_.free_host(b->host);
  }
}

StagingPool::Buffer* StagingPool::acquire(size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  Buffer* best = nullptr;
  for (auto& b : bufs_)
    if (!b->in_use && b->capacity >= bytes && (!best || b->capacity < best->capacity) && st_.done(b->mark))
      best = b.get();
  if (best) {
    ++stats_.reuses;
    best->in_use = true;
    return best;
  }
  size_t cap = size_t(64) << 10;
  while (cap < bytes) cap *= 2;
  auto b = std::make_unique<Buffer>();
  b->host = st_.alloc_host(cap);
  try {
    b->mark = st_.new_mark();
  } catch (...) {
    st_.free_host(b->host);
    throw;
  }
  b->capacity = cap;
  b->in_use = true;
  ++stats_.allocations;
  stats_.bytes_held += int64_t(cap);
  bufs_.push_back(std::move(b));
  return bufs_.back().get();
}

void StagingPool::release(Buffer* b) {
  std::lock_guard<std::mutex> lk(mu_);
  b->in_use = false;
  // beyond the bytes kept: free whole free buffers whose copies are done, largest first
  if (stats_.bytes_held <= int64_t(keep_)) return;
  std::sort(bufs_.begin(), bufs_.end(), [](const auto& x, const auto& y) { return x->capacity > y->capacity; });
  for (auto it = bufs_.begin(); it != bufs_.end() && stats_.bytes_held > int64_t(keep_);) {
    Buffer* f = it->get();
    if (f->in_use || !st_.done(f->mark)) {
      ++it;
      continue;
    }
    stats_.bytes_held -= int64_t(f->capacity);
    st_.free_mark(f->mark);
    st_.free_host(f->host);
    it = bufs_.erase(it);
  }
}

void StagingPool::abandon(Buffer* b) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = bufs_.begin(); it != bufs_.end(); ++it)
    if (it->get() == b) {
      stats_.bytes_held -= int64_t(b->capacity);
      it->release();  // leaked on purpose: the inner transport may still write into it
      bufs_.erase(it);
      return;
    }
}

StagingPool::Stats StagingPool::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void StagingPool::count_host_wait() {
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.host_waits;
}

namespace {

// An inner request on a staging buffer. `to_device`: a receive, whose bytes
// are copied into the device buffer once it completes.
class StagedRequest final : public Request {
 public:
  StagedRequest(StagingPool& pool, StagingPool::Buffer* buf, std::unique_ptr<Request> inner, void* dev,
                size_t bytes)
      : pool_(pool), buf_(buf), inner_(std::move(inner)), dev_(dev), bytes_(bytes) {}
  ~StagedRequest() override {
    if (buf_) pool_.abandon(buf_);
  }
  void wait() override {
    if (!buf_) return;
    inner_->wait();
    finish();
  }
  bool test() override {
    if (!buf_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (dev_) pool_.staging().from_host(dev_, buf_->host, bytes_, buf_->mark);
    pool_.release(buf_);
    buf_ = nullptr;
  }
  StagingPool& pool_;
  StagingPool::Buffer* buf_;
  std::unique_ptr<Request> inner_;
  void* dev_;  // receives only
  size_t bytes_;
};

}  // namespace

std::unique_ptr<Request> StagingTransport::isend(const void* buf, size_t bytes, int dst, uint32_t tag) {
  if (bytes == 0) return inner_.isend(buf, 0, dst, tag);
  StagingPool::Buffer* b = pool_.acquire(bytes);
  std::unique_ptr<Request> inner;
  try {
    pool_.staging().to_host(b->host, buf, bytes, b->mark);
    pool_.staging().wait(b->mark);  // the inner transport reads host memory from now on
    pool_.count_host_wait();
    inner = inner_.isend(b->host, bytes, dst, tag);
  } catch (...) {
    pool_.abandon(b);
    throw;
  }
  return std::make_unique<StagedRequest>(pool_, b, std::move(inner), nullptr, bytes);
}

std::unique_ptr<Request> StagingTransport::irecv(void* buf, size_t bytes, int src, uint32_t tag) {
  if (bytes == 0) return inner_.irecv(buf, 0, src, tag);
  StagingPool::Buffer* b = pool_.acquire(bytes);
  std::unique_ptr<Request> inner;
  try {
    inner = inner_.irecv(b->host, bytes, src, tag);
  } catch (...) {
    pool_.abandon(b);
    throw;
  }
  return std::make_unique<StagedRequest>(pool_, b, std::move(inner), buf, bytes);
}

}  // namespace dynamiq
