// Device memory and the stream dynamiq's CUDA work goes to.
//
// current_stream(): the stream every CUDA call dynamiq makes on this thread
// is ordered on (kernels, copies, allocations, the waits after them). It is
// the legacy default stream unless a StreamScope is active; the torch binding
// opens one with the group worker's stream of its own (python/dynamiq/_worker.py),
// so that dynamiq's kernels and waits neither wait for nor hold up the
// training's kernels on other streams.
//
// device_alloc / device_free: device memory in stream order, from a memory
// pool of dynamiq's own (cudaMallocFromPoolAsync / cudaFreeAsync): unlike
// cudaFree, which synchronises the whole device (it would wait for the
// backward pass still running on the training's stream), a free waits for
// nothing. Devices without memory pools fall back to cudaMalloc / cudaFree.
// Freed memory stays reserved in the pool for reuse until device_memory().trim()
// (called when the executor's buffer pool shrinks).
//
// device_memory(): the Memory (../codec.h) the executor allocates its message
// buffers and accumulator in when it runs the CUDA codecs (on current_stream()),
// and how an in-process transport stages their messages. A single static
// instance (buffer pools are keyed by its address). Status: compiled with
// nvcc in CI and run there on the CPU emulation of CUDA; never on a GPU.
#pragma once

#include <cuda_runtime.h>

#include "kernels/codec.h"

namespace dynamiq {
namespace cuda {

cudaStream_t current_stream();

// Makes `stream` (a cudaStream_t) this thread's current_stream() until destroyed.
class StreamScope {
 public:
  explicit StreamScope(void* stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t prev_;
};

// At least `bytes` bytes (also for 0) on the current device, ordered on
// `stream`; throws Error on failure.
void* device_alloc(size_t bytes, cudaStream_t stream);
// Frees in stream order on `stream` (null p: nothing).
void device_free(void* p, cudaStream_t stream);

// n Ts of device memory in stream order on `stream`, freed (in stream order)
// on scope exit: the scratch arrays of the passes and launchers.
template <typename T>
struct DeviceArray {
  T* p = nullptr;
  cudaStream_t stream;
  DeviceArray(size_t n, cudaStream_t s) : stream(s) {
    if (n) p = static_cast<T*>(device_alloc(n * sizeof(T), stream));
  }
  ~DeviceArray() { device_free(p, stream); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

const Memory& device_memory();

}  // namespace cuda
}  // namespace dynamiq
