// cuda::device(): see cuda_device.h.
#include "kernels/base/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/base/float_bits.h"

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

// Page-locked buffers and events; copies on the calling thread's current stream.
class CudaStaging final : public HostStaging {
 public:
  void* alloc_host(size_t bytes) const override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable), "page-locked allocation");
    return p;
  }
  void free_host(void* p) const override { check(cudaFreeHost(p), "page-locked free"); }
  void* new_mark() const override {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
    return e;
  }
  void free_mark(void* mark) const override { cudaEventDestroy(static_cast<cudaEvent_t>(mark)); }
  void to_host(void* host_dst, const void* dev_src, size_t bytes, void* mark) const override {
    copy(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost, mark);
  }
  void from_host(void* dev_dst, const void* host_src, size_t bytes, void* mark) const override {
    copy(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, mark);
  }
  void wait(void* mark) const override { check(cudaEventSynchronize(static_cast<cudaEvent_t>(mark)), "staging wait"); }
  bool done(void* mark) const override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(mark));
    if (e == cudaErrorNotReady) return false;
    check(e, "staging query");
    return true;
  }

 private:
  static void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, void* mark) {
    const cudaStream_t st = current_stream();
    check(cudaMemcpyAsync(dst, src, bytes, kind, st), kind == cudaMemcpyDeviceToHost ? "staging copy to the host"
                                                                                     : "staging copy to the device");
    check(cudaEventRecord(static_cast<cudaEvent_t>(mark), st), "staging event");
  }
};

class CudaDevice final : public Device {
 public:
  // The first use of the CUDA device registers the CUDA codecs (registry_cuda.cu).
  CudaDevice() { register_codecs(); }
  std::string name() const override { return "cuda"; }
  const Memory& memory() const override { return device_memory(); }
  void* stream() const override { return current_stream(); }

  // On this thread's current stream (cuda_memory.h), waited for.
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
  const HostStaging* staging() const override { return &staging_; }

 private:
  CudaStaging staging_;
};

}  // namespace

const Device& device() {
  static const CudaDevice d;
  return d;
}

}  // namespace cuda
}  // namespace dynamiq
