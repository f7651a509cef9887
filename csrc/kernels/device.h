// A device a collective can run on when its buckets are not in host memory:
// its memory, the device versions of the local passes, and the codecs over its
// kernels. The collective driver (hook/collective.h, CallArgs::device) uses it
// in place of the CPU codecs; everything else (header exchange, allocator,
// plan, schedule) stays on the host. cuda/cuda_device.h implements it.
#pragma once

#include <memory>

#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/codec.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  virtual const Memory& memory() const = 0;
  // dynamiq_local_stats (dynamiq_stats.h) on device data, the stats written to host memory.
  virtual bool dynamiq_stats(const void* data, DType dtype, int64_t numel, int32_t S, float* host_stats) const = 0;
  // has_nonfinite on device data.
  virtual bool has_nonfinite(const void* data, DType dtype, int64_t numel) const = 0;
  virtual std::unique_ptr<Codec> identity_codec() const = 0;
  virtual std::unique_ptr<Codec> dynamiq_codec(const DynamiqParams& p) const = 0;
  virtual std::unique_ptr<Codec> bitsplit_codec(const BitsplitParams& p) const = 0;
  virtual std::unique_ptr<Codec> lossless_codec(const LosslessOptions& opt) const = 0;
};

}  // namespace dynamiq
