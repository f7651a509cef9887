// cuda::device(): see cuda_device.h.
#include "kernels/base/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/base/float_bits.h"
#include "kernels/bitsplit/cuda/bitsplit_cuda_codec.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"
#include "kernels/dynamiq/cuda/dynamiq_kernels.h"
#include "kernels/identity/cuda/identity_cuda_codec.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/lossless/cuda/lossless_cuda_codec.h"

namespace dynamiq {
namespace cuda {
namespace {

void check(cudaError_t e, const char* what) { cuda::check(e, "cuda device", what); }

// *flag |= 1 if any value is inf or nan (DTypeTraits<T>::nonfinite).
template <DType T>
__global__ void nonfinite_kernel(const void* data, int64_t n, uint32_t* flag) {
  using Tr = DTypeTraits<T>;
  const auto* p = static_cast<const typename Tr::storage*>(data);
  uint32_t bad = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad |= Tr::nonfinite(p[i]);
  if (bad) atomicOr(flag, 1u);
}

class CudaDevice final : public Device {
 public:
  std::string name() const override { return "cuda"; }
  const Memory& memory() const override { return device_memory(); }

  // Everything on this thread's current stream (cuda_memory.h), waited for.
  bool dynamiq_stats(const void* data, DType dtype, int64_t numel, int32_t S, float* host_stats) const override {
    if (numel <= 0) return false;
    const cudaStream_t st = current_stream();
    const int64_t units = ceil_div<int64_t>(numel, S);
    DeviceArray<float> stats_d(size_t(2 * units), st);
    DeviceArray<uint32_t> flag(1, st);
    check(cudaMemsetAsync(flag.p, 0, sizeof(uint32_t), st), "statistics");
    check(cudaError_t(stats(data, dtype, numel, S, stats_d.p, flag.p,
                            st)),
          "statistics");
    uint32_t bad = 0;
    check(cudaMemcpyAsync(host_stats, stats_d.p, size_t(2 * units) * sizeof(float), cudaMemcpyDeviceToHost, st),
          "statistics");
    check(cudaMemcpyAsync(&bad, flag.p, sizeof(bad), cudaMemcpyDeviceToHost, st), "statistics");
    check(cudaStreamSynchronize(st), "statistics");
    return bad != 0;
  }

  bool has_nonfinite(const void* data, DType dtype, int64_t numel) const override {
    if (numel <= 0) return false;
    const cudaStream_t st = current_stream();
    DeviceArray<uint32_t> flag(1, st);
    check(cudaMemsetAsync(flag.p, 0, sizeof(uint32_t), st), "non-finite scan");
    const unsigned grid = unsigned(std::min<int64_t>((numel + 255) / 256, 1024));
    DQ_DISPATCH_DTYPE(dtype, T, [&] { DQ_LAUNCH(nonfinite_kernel<T>, grid, 256, 0, st)(data, numel, flag.p); });
    check(cudaGetLastError(), "non-finite scan");
    uint32_t bad = 0;
    check(cudaMemcpyAsync(&bad, flag.p, sizeof(bad), cudaMemcpyDeviceToHost, st), "non-finite scan");
    check(cudaStreamSynchronize(st), "non-finite scan");
    return bad != 0;
  }

  // The codecs run on the stream current when they are made (the collective's).
  std::unique_ptr<Codec> identity_codec() const override {
    return std::make_unique<IdentityCudaCodec>(current_stream());
  }
  std::unique_ptr<Codec> dynamiq_codec(const DynamiqParams& p) const override {
    return std::make_unique<DynamiqCudaCodec>(p, current_stream());
  }
  std::unique_ptr<Codec> bitsplit_codec(const BitsplitParams& p) const override {
    return std::make_unique<BitsplitCudaCodec>(p, current_stream());
  }
  std::unique_ptr<Codec> lossless_codec(const LosslessOptions& opt) const override {
    return std::make_unique<LosslessCudaCodec>(opt, current_stream());
  }
};

}  // namespace

const Device& device() {
  static const CudaDevice d;
  return d;
}

}  // namespace cuda
}  // namespace dynamiq
