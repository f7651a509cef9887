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
};

}  // namespace dynamiq
