// Device memory and the current stream: see cuda_memory.h.
#include "kernels/base/cuda/cuda_memory.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

#include "kernels/base/cuda/launch.h"

namespace dynamiq {
namespace cuda {
namespace {

void check(cudaError_t e, const char* what, size_t bytes) {
  cuda::check(e, "cuda memory", std::string(what) + " of " + std::to_string(bytes) + " bytes");
}

thread_local cudaStream_t t_stream = nullptr;

// Per device: dynamiq's memory pool (nullptr: the device has none, use
// cudaMalloc). Fallback allocations are remembered so that device_free
// knows how to free them.
struct Pools {
  std::mutex mu;
  std::map<int, cudaMemPool_t> pool;
  std::unordered_set<void*> fallback;
};
Pools& pools() {
  static auto* p = new Pools();  // never destroyed: frees may come from exiting threads
  return *p;
}

cudaMemPool_t pool_for_current_device() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice", 0);
  Pools& ps = pools();
  std::lock_guard<std::mutex> lk(ps.mu);
  auto it = ps.pool.find(dev);
  if (it != ps.pool.end()) return it->second;
  cudaMemPool_t pool = nullptr;
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess && supported) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate", 0);
    // keep freed memory for reuse (the default, 0, returns it at every
    // synchronisation); the executor's buffer pool bounds what is in use, and
    // DeviceMemory::trim returns the rest when that pool shrinks
    uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute", 0);
    // The pool is shared by every group's worker stream: a reuse that made one
    // worker's stream wait for another's free (the driver may insert such a
    // dependency under memory pressure) could order two groups' collectives
    // differently on two ranks and deadlock them. Only reuse that is already
    // ordered (opportunistic, event dependencies) stays allowed.
    int no = 0;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no), "cudaMemPoolSetAttribute",
          0);
  }
  ps.pool[dev] = pool;
  return pool;
}

}  // namespace

cudaStream_t current_stream() { return t_stream; }

StreamScope::StreamScope(void* stream) : prev_(t_stream) { t_stream = static_cast<cudaStream_t>(stream); }
StreamScope::~StreamScope() { t_stream = prev_; }

void* device_alloc(size_t bytes, cudaStream_t stream) {
  const size_t n = bytes > 0 ? bytes : 1;
  void* p = nullptr;
  if (cudaMemPool_t pool = pool_for_current_device()) {
    check(cudaMallocFromPoolAsync(&p, n, pool, stream), "cudaMallocFromPoolAsync", bytes);
    return p;
  }
  check(cudaMalloc(&p, n), "cudaMalloc", bytes);
  Pools& ps = pools();
  std::lock_guard<std::mutex> lk(ps.mu);
  ps.fallback.insert(p);
  return p;
}

void device_free(void* p, cudaStream_t stream) {
  if (!p) return;
  {
    Pools& ps = pools();
    std::lock_guard<std::mutex> lk(ps.mu);
    if (ps.fallback.erase(p)) {
      cudaFree(p);
      return;
    }
  }
  cudaFreeAsync(p, stream);
}

namespace {

// Copies between host and device memory run on the current stream and are
// waited for (the host side may be pageable memory or freed right after).
class DeviceMemory final : public Memory {
 public:
  std::string name() const override { return "cuda"; }
  void* allocate(size_t bytes) const override { return device_alloc(bytes, current_stream()); }
  void release(void* p) const override { device_free(p, current_stream()); }
  // Returns the pool's free reservations on the current device to the driver.
  void trim() const override {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return;
    // frees not yet observed complete on the host count as in use: wait for them
    // (trimming runs only when a buffer pool shrinks)
    cudaStreamSynchronize(current_stream());
    Pools& ps = pools();
    std::lock_guard<std::mutex> lk(ps.mu);
    auto it = ps.pool.find(dev);
    if (it != ps.pool.end() && it->second) cudaMemPoolTrimTo(it->second, 0);
  }
  int domain() const override {
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess ? dev : 0;
  }
  void to_host(void* dst, const void* src, size_t bytes) const override { copy(dst, src, bytes, cudaMemcpyDeviceToHost); }
  void from_host(void* dst, const void* src, size_t bytes) const override {
    copy(dst, src, bytes, cudaMemcpyHostToDevice);
  }

 private:
  static void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (!bytes) return;
    const char* what = kind == cudaMemcpyDeviceToHost ? "copy to the host" : "copy from the host";
    check(cudaMemcpyAsync(dst, src, bytes, kind, current_stream()), what, bytes);
    check(cudaStreamSynchronize(current_stream()), what, bytes);
  }
};

}  // namespace

const Memory& device_memory() {
  static const DeviceMemory m;
  return m;
}

}  // namespace cuda
}  // namespace dynamiq
