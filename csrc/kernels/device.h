// A device a collective can run on when its buckets are not in host memory:
// its memory, the stream its work runs on, and the non-finite scan. The
// collective driver (hook/collective/collective.h, CallArgs::device) uses it
// in place of host memory; the codecs on a device come from the codec
// registry (registry.h: each mode's device codec factory for Device::name()),
// and everything else (header exchange, allocator, plan, schedule) stays on
// the host. base/cuda/cuda_device.h implements it.
#pragma once

#include <string>

#include "kernels/codec.h"

namespace dynamiq {

// Copies between a device's memory and page-locked host memory, queued on the
// device's current stream (Device::stream()), each followed by a completion
// mark (CUDA: an event) the host can test or wait for. What a transport that
// only moves host memory (Gloo) needs to carry device buffers
// (hook/transport/staging_transport.h).
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  // Page-locked host memory (copies to and from it are truly asynchronous).
  virtual void* alloc_host(size_t bytes) const = 0;
  virtual void free_host(void* p) const = 0;
  virtual void* new_mark() const = 0;
  virtual void free_mark(void* mark) const = 0;
  // Queue the copy, then record `mark` after it.
  virtual void to_host(void* host_dst, const void* dev_src, size_t bytes, void* mark) const = 0;
  virtual void from_host(void* dev_dst, const void* host_src, size_t bytes, void* mark) const = 0;
  // The host waits until everything before the mark's last record is done.
  virtual void wait(void* mark) const = 0;
  // Whether it is done (never blocks).
  virtual bool done(void* mark) const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // The key of this kind of device's codecs in the registry ("cuda").
  virtual std::string name() const = 0;
  virtual const Memory& memory() const = 0;
  // The stream device work is ordered on now (CUDA: the calling thread's
  // current stream, a cudaStream_t); codecs made now run there.
  virtual void* stream() const = 0;
  // has_nonfinite (base/nonfinite.h) on device data.
  virtual bool has_nonfinite(const void* data, DType dtype, int64_t numel) const = 0;
  // Host staging of device buffers (null: this device has none).
  virtual const HostStaging* staging() const { return nullptr; }
};

}  // namespace dynamiq
