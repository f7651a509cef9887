// Device buffers over a transport that moves host memory only (Gloo): every
// message is staged through page-locked host memory around the inner
// transport, on the device's current stream (kernels/device.h HostStaging):
//   send:    device -> host copy queued after the kernel that wrote the
//            message, the host waits for it (the one wait a send needs: the
//            inner transport reads host memory), then the inner send;
//   receive: the inner receive into host memory; when it completes (wait or
//            a successful test) the host -> device copy is queued, and the
//            kernels queued after it read the message in stream order (no
//            host wait).
// The host buffers come from a StagingPool that outlives the transport (one
// per thread that runs collectives): a buffer is reused only once its last
// copy is done (its mark), so a later receive never overwrites bytes a
// queued host -> device copy has not read yet. A request dropped before it
// completed (a failed collective) keeps its buffer for ever: the inner
// transport may still write into it.
//
// Everything else (tags, groups, posting rules, the header exchange's int64
// all-reduce, which is host data) goes to the inner transport unchanged, so
// the bytes on the wire, and the results, equal a host run's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hook/transport/transport.h"
#include "kernels/device.h"

namespace dynamiq {

class StagingPool {
 public:
  struct Buffer {
    void* host = nullptr;
    size_t capacity = 0;
    void* mark = nullptr;  // recorded after the buffer's last copy
    bool in_use = false;
  };
  // Free buffers beyond `keep_bytes` are returned to the system at release.
  explicit StagingPool(const HostStaging& staging, size_t keep_bytes = size_t(256) << 20);
  ~StagingPool();  // waits for every buffer's last copy, then frees them
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  const HostStaging& staging() const { return st_; }
  // A buffer of at least `bytes`: a free one whose last copy is done, else a
  // new one (capacity: a power of two, at least 64 KiB).
  Buffer* acquire(size_t bytes);
  // In use no more (its mark, if recorded after acquire, still guards reuse).
  void release(Buffer* b);
  // Kept for ever (a request dropped while the inner transport may still use it).
  void abandon(Buffer* b);

  struct Stats {
    int64_t allocations = 0;  // page-locked allocations made
    int64_t reuses = 0;       // acquires served by a free buffer
    int64_t host_waits = 0;   // waits for a device -> host copy (one per sent message)
    int64_t bytes_held = 0;   // page-locked bytes held now (free and in use)
  };
  Stats stats() const;
  void count_host_wait();

 private:
  const HostStaging& st_;
  const size_t keep_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Buffer>> bufs_;  // (abandoned ones are moved out)
  Stats stats_;
};

class StagingTransport final : public Transport {
 public:
  // `inner` carries host memory; the buffers passed here are `staging`'s
  // device memory, copied on the current stream.
  StagingTransport(Transport& inner, StagingPool& pool) : inner_(inner), pool_(pool) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override;
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override;
  void group_start() override { inner_.group_start(); }
  void group_end() override { inner_.group_end(); }
  bool posts_in_order() const override { return inner_.posts_in_order(); }
  bool accepts_shorter_messages() const override { return inner_.accepts_shorter_messages(); }
  void allreduce_sum_i64(int64_t* data, size_t count) override { inner_.allreduce_sum_i64(data, count); }

 private:
  Transport& inner_;
  StagingPool& pool_;
};

}  // namespace dynamiq
