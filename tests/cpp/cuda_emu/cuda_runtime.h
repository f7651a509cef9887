// A CPU stand-in for the part of the CUDA runtime and execution model that
// dynamiq's kernels use, so that the CUDA sources (csrc/kernels/*/cuda/*.cu) and
// their GPU tests (tests/cpp/cuda_*.cu) compile with the host compiler and RUN
// on a machine without a GPU. It is found instead of the real <cuda_runtime.h>
// only by the dynamiq_cuda_emu_tests target (its include directory comes first).
//
// What it models:
//   - a launch runs the grid one block after another (in linear index order, or
//     in reverse with the threads below: a GPU orders blocks in no way); the threads of a block are
//     fibers on one OS thread, each on its own stack (switched without a system
//     call on x86-64, by ucontext elsewhere: cuda_emu.cc), switched only at
//     sync points: __syncthreads() (and _count/_and/_or) and the warp
//     operations. Between sync points the threads run one after the other in
//     index order, or in reverse order with DYNAMIQ_CUDA_EMU_ORDER=reverse: a
//     missing barrier or __syncwarp between a write and a read by another
//     thread changes the result in at least one of the two orders.
//   - a barrier that not every live thread of the block reaches (some threads
//     returned, others wait) fails the launch, as it is undefined on a GPU.
//   - warps (device_functions.h): a warp is 32 consecutive threads (linear
//     index / 32). __syncwarp, __shfl*_sync (with width), __ballot/__any/
//     __all/__match_*_sync and __reduce_*_sync are sync points for the lanes
//     their mask names: a lane waits there until all of them have reached the
//     same operation (kind and mask), then each gets PTX's result; the last
//     lane to arrive goes on without a switch. A shuffle's read of a lane
//     outside the mask gives 0xA5 bytes. The launch fails, with a message, if
//     a mask leaves out the calling lane, names lanes the block does not have
//     (a partial last warp) or lanes that have exited, or if lanes wait at
//     different points so that nothing can go on. __activemask() answers the
//     warp's lanes that have not exited: the emulation has no divergence, so
//     it cannot show a mask taken from __activemask() inside a branch being
//     too small (or a sync a GPU's reconvergence would have made implicit).
//   - alignment: CUDA's vector types (vector_types.h) have CUDA's alignment,
//     and the emulated targets build with -fsanitize=alignment (no recovery):
//     a load or store through a float4* (uint4*, uint2*, ...; any typed
//     pointer) that is not aligned to its type stops the program with
//     "misaligned address", as a GPU faults. Not caught: accesses by memcpy
//     or bytewise, and code under __CUDA_ARCH__ (not compiled here).
//   - __shared__ variables are one static copy (blocks never overlap), set to
//     0xA5 before every block (only in non-template, non-inline kernels: gcc
//     keeps the static locals of templates and inline functions out of the
//     section this relies on, and keeps their values); dynamic
//     shared memory is a buffer of exactly the launch's size (rounded up to 16
//     bytes) that ends at an inaccessible page, filled with 0xA5 before every
//     block.
//   - launch configurations are checked as the GPU would: 1..1024 threads per
//     block, grid dimensions >= 1 (x <= 2^31 - 1, y and z <= 65535), dynamic
//     shared memory <= 48 KiB; a bad one sets cudaErrorInvalidConfiguration for
//     cudaGetLastError() and runs nothing.
//   - cudaMalloc returns 256-byte-aligned memory filled with 0xA5 (device
//     memory is not zeroed), ending at most 255 bytes before an inaccessible
//     guard page (reads or writes past the end fault; the slack is a canary
//     checked by cudaFree). cudaMemcpy/cudaMemset check that the device side
//     of a copy lies inside one live allocation and the host side inside none.
//   - streams are queues, as on a GPU: work on a stream made with
//     cudaStreamCreateWithFlags (launches, cudaMemcpyAsync, cudaMemsetAsync,
//     cudaFreeAsync, event records) is queued and runs, in order, only when
//     the host waits for it (cudaStreamSynchronize, cudaEventSynchronize,
//     cudaDeviceSynchronize, a second cudaEventQuery, a stream made to wait for
//     an event whose stream is then run), never on its own. So a result read
//     before its stream was waited for is stale (device memory starts 0xA5),
//     and host memory a queued copy reads is read when the copy runs: code
//     that reuses page-locked memory too early, or forgets a wait, gets wrong
//     bytes. The legacy default stream (nullptr) runs at the call, after the
//     queued work of every blocking stream (flags 0), never of a non-blocking
//     one. Copies follow CUDA's host-memory rules: page-locked memory
//     (cudaHostAlloc / cudaMallocHost) is read or written when the copy runs;
//     a copy from pageable memory reads it at the call, a copy to pageable
//     memory waits for its stream. cudaFree and cudaFreeHost wait for every
//     stream. A cudaEventQuery of an event still queued answers
//     cudaErrorNotReady once and runs its stream up to the event, so polling
//     progresses. A queued copy or memset whose device memory was freed before
//     it ran is reported as a use after free (sticky error).
//     DYNAMIQ_CUDA_EMU_ASYNC=0 (or set_async_streams(false)) runs all work at
//     the call instead.
//   - calls from several host threads are serialised (one lock); the last
//     error is per host thread, a failed launch's error sticky for all, as in
//     CUDA. Streams are distinct handles, and the stream of every launch,
//     copy, allocation and wait can be logged (api_log below), so tests can
//     check which stream each piece of work was ordered on.
//   - devices: cudaSetDevice/cudaGetDevice keep a current device id per host
//     thread (cudaGetDeviceCount says 1; ids are only labels: one memory).
//   - memory pools: cudaMallocFromPoolAsync / cudaFreeAsync allocate and free
//     like cudaMalloc / cudaFree (at the call); whether the device reports
//     pool support can be switched for tests of a fallback.
// What it does not model: lanes of a warp running in lock step (between sync
// points they run one after the other, so code relying on implicit warp
// synchronism fails here as it may on sm_70+), the memory model between
// concurrently running threads, code under __CUDA_ARCH__ (not compiled here:
// the host branches of the shared headers run), occupancy, timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#define DYNAMIQ_CUDA_EMULATION 1

#define __global__
#define __device__
#define __host__
// Static shared variables all live in one linker section, which the emulator
// fills with 0xA5 before every block (shared memory starts undefined on a GPU).
#define __shared__ static __attribute__((section("dq_emu_shared")))
#define __align__(n) __attribute__((aligned(n)))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)

#include "vector_types.h"

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};
typedef cudaError_t cudaError;

enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st;
typedef CUstream_st* cudaStream_t;
constexpr unsigned cudaStreamDefault = 0;
constexpr unsigned cudaStreamNonBlocking = 1;

struct CUevent_st;
typedef CUevent_st* cudaEvent_t;
constexpr unsigned cudaEventDefault = 0;
constexpr unsigned cudaEventBlockingSync = 1;
constexpr unsigned cudaEventDisableTiming = 2;

constexpr unsigned cudaHostAllocDefault = 0;
constexpr unsigned cudaHostAllocPortable = 1;

struct CUmemPoolHandle_st;
typedef CUmemPoolHandle_st* cudaMemPool_t;
enum cudaMemAllocationType : int { cudaMemAllocationTypeInvalid = 0, cudaMemAllocationTypePinned = 1 };
enum cudaMemAllocationHandleType : int { cudaMemHandleTypeNone = 0 };
enum cudaMemLocationType : int { cudaMemLocationTypeInvalid = 0, cudaMemLocationTypeDevice = 1 };
struct cudaMemLocation {
  cudaMemLocationType type;
  int id;
};
struct cudaMemPoolProps {
  cudaMemAllocationType allocType;
  cudaMemAllocationHandleType handleTypes;
  cudaMemLocation location;
  void* win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};
enum cudaMemPoolAttr : int { cudaMemPoolReuseAllowInternalDependencies = 3, cudaMemPoolAttrReleaseThreshold = 4 };
enum cudaDeviceAttr : int { cudaDevAttrMemoryPoolsSupported = 115 };

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

// The built-in variables, set by the emulator before it resumes a thread.
inline uint3 threadIdx{0, 0, 0};
inline uint3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};
inline dim3 gridDim{1, 1, 1};

cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);  // per host thread; every device shares the one emulated memory
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t min_bytes_to_keep);
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t bytes, cudaMemPool_t pool, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* count);
const char* cudaGetErrorString(cudaError_t e);

void __syncthreads();
// __syncthreads() that also counts, ANDs or ORs a predicate over the block's threads
int __syncthreads_count(int predicate);
int __syncthreads_and(int predicate);
int __syncthreads_or(int predicate);

// Atomics: threads switch only at barriers, so a plain read-modify-write is atomic.
template <typename T>
T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}

#include "device_functions.h"  // warps, shuffles, votes, integer intrinsics

namespace dynamiq_cuda_emu {

// The lock every runtime call and every launch holds.
std::unique_lock<std::recursive_mutex> lock();

// Runs body(t) for every thread t of one block as fibers (see above); returns
// false (and reports on stderr) when its barriers or warp operations diverged
// or a warp operation broke a rule.
bool run_block(unsigned threads, void (*body)(void*), void* arg);
// Checks a launch configuration; sets the last error and returns false if bad.
bool check_launch(dim3 grid, dim3 block, size_t smem);
// Runs a checked launch's grid, block after block (body(ctx) is one thread).
void run_grid(dim3 grid, dim3 block, size_t smem, void (*body)(void*), void* ctx);
// Queues work on `stream` (see "streams are queues" above), or runs it now on
// the legacy default stream or with queues off.
void submit(cudaStream_t stream, std::function<void()> work);
// Whether work on streams is queued (default: DYNAMIQ_CUDA_EMU_ASYNC, on
// unless "0"); returns the previous setting. Waits for every stream first.
bool set_async_streams(bool on);
bool async_streams();
// The current block's dynamic shared memory (ends at an inaccessible page).
unsigned char* dynamic_smem();

// The runtime calls made while the log is on, in order: name and the stream
// the call was ordered on (nullptr: the legacy default stream, also for the
// calls that take no stream: cudaMalloc, cudaFree, cudaMemcpy, cudaMemset,
// cudaDeviceSynchronize, which synchronise with it). Launches log "launch".
struct ApiCall {
  const char* name;
  cudaStream_t stream;
  std::thread::id thread;  // the host thread that made the call
};
void set_api_log(bool on);  // also clears it
std::vector<ApiCall> api_log();
void log_call(const char* name, cudaStream_t stream);  // (for the launcher)
// Device-to-host copies (cudaMemcpy, cudaMemcpyAsync; counted when issued,
// zero-byte ones not) since the last reset, from every host thread.
struct CopyCounts {
  unsigned long long d2h_copies = 0;
  unsigned long long d2h_bytes = 0;
};
CopyCounts copy_counts();
void reset_copy_counts();
// What cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported) reports (default true);
// returns the previous setting.
bool set_memory_pools_supported(bool on);
// While on, a launch is checked, logged and queued as usual but its grid is
// not run when its turn comes (the kernel does nothing): for tests that time
// the host side of calls on buckets whose emulated kernels would take minutes
// (tests/cpp/cuda_host_cost.cu). Read at the launch; returns the previous setting.
bool set_skip_kernels(bool on);
bool skip_kernels_locked();  // (for the launcher, which holds the lock)

// For the emulator's own tests: the order threads run between barriers
// (default: DYNAMIQ_CUDA_EMU_ORDER; returns the previous one), and clearing a
// failed launch's sticky error.
bool set_reverse_order(bool reverse);
void reset_errors();

template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;

  template <typename... A>
  void operator()(A&&... a) const {
    const auto held = lock();
    log_call("launch", stream);
    if (!check_launch(grid, block, smem)) return;
    // kernel parameters are copied once per launch, as the GPU does
    auto args = std::make_shared<std::tuple<P...>>(std::forward<A>(a)...);
    void (*k)(P...) = kernel;
    const dim3 g = grid, b = block;
    const size_t sm = smem;
    const bool skip = skip_kernels_locked();
    submit(stream, [k, args, g, b, sm, skip] {
      if (skip) return;
      struct Ctx {
        void (*kernel)(P...);
        std::tuple<P...>* args;
      } ctx{k, args.get()};
      auto body = [](void* c) {
        Ctx* x = static_cast<Ctx*>(c);
        std::apply(x->kernel, *x->args);
      };
      run_grid(g, b, sm, body, &ctx);
    });
  }
};

template <typename... P>
Launcher<P...> launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  return Launcher<P...>{kernel, grid, block, smem, stream};
}

}  // namespace dynamiq_cuda_emu
