// device_memory(): see cuda_memory.h.
#include "cuda_memory.h"

#include <cuda_runtime.h>

#include <string>

#include "launch.h"

namespace dynamiq {
namespace cuda {
namespace {

void check(cudaError_t e, const char* what, size_t bytes) {
  cuda::check(e, "cuda memory", std::string(what) + " of " + std::to_string(bytes) + " bytes");
}

class DeviceMemory final : public Memory {
 public:
  std::string name() const override { return "cuda"; }
  void* allocate(size_t bytes) const override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc", bytes);
    return p;
  }
  void release(void* p) const override { cudaFree(p); }
  void to_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to the host", bytes);
  }
  void from_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy from the host", bytes);
  }
};

}  // namespace

const Memory& device_memory() {
  static const DeviceMemory m;
  return m;
}

}  // namespace cuda
}  // namespace dynamiq
