// The CUDA emulator's own properties (cuda_runtime.h): the ones the GPU tests
// rely on to find barrier, launch and memory mistakes without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "kernels/base/cuda/launch.h"

namespace {

using dynamiq_cuda_emu::reset_errors;
using dynamiq_cuda_emu::set_reverse_order;

// Restores the thread order (tests below switch it) and clears errors.
struct BothOrders {
  const bool reverse = set_reverse_order(false);
  ~BothOrders() {
    set_reverse_order(reverse);
    reset_errors();
  }
};

template <typename T>
std::vector<T> get(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// out[linear global thread id] = its id + 1, for a 3-d grid of 3-d blocks
__global__ void ids_kernel(unsigned* out) {
  const unsigned tpb = blockDim.x * blockDim.y * blockDim.z;
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[b * tpb + t] += b * tpb + t + 1;
}

TEST(CudaEmulator, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const size_t n = 12 * 24;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, n * sizeof(unsigned)), cudaSuccess);
  DQ_LAUNCH(ids_kernel, grid, block, 0, nullptr)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = get(d, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], unsigned(i + 1)) << i;
  cudaFree(d);
}

// Host threads launching at once (the in-process collective's ranks do): each
// gets its own results and its own last error.
TEST(CudaEmulator, CallsFromSeveralHostThreads) {
  std::vector<std::thread> th;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    th.emplace_back([k, &ok] {
      const size_t n = 12 * 24;
      unsigned* d = nullptr;
      bool good = cudaMalloc(&d, n * sizeof(unsigned)) == cudaSuccess;
      for (int rep = 0; rep < 20 && good; ++rep) {
        good = cudaMemset(d, 0, n * sizeof(unsigned)) == cudaSuccess;
        if (k == 0 && rep == 5) {  // only this thread sees its bad launch
          DQ_LAUNCH(ids_kernel, 0, 1, 0, nullptr)(d);
          good = good && cudaGetLastError() == cudaErrorInvalidConfiguration;
        }
        DQ_LAUNCH(ids_kernel, dim3(3, 2, 2), dim3(4, 3, 2), 0, nullptr)(d);
        good = good && cudaGetLastError() == cudaSuccess;
        std::vector<unsigned> h(n);
        good = good && cudaMemcpy(h.data(), d, n * sizeof(unsigned), cudaMemcpyDeviceToHost) == cudaSuccess;
        for (size_t i = 0; i < n && good; ++i) good = h[i] == unsigned(i + 1);
      }
      cudaFree(d);
      ok[size_t(k)] = good ? 1 : 0;
    });
  testing::internal::CaptureStderr();
  for (auto& t : th) t.join();
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// Each thread writes its slot of shared memory, then reads its right
// neighbour's: correct only with the barrier in between.
__device__ void neighbours(unsigned* s, unsigned* out, bool barrier) {
  s[threadIdx.x] = threadIdx.x * 7 + 1;
  if (barrier) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
__global__ void neighbour_kernel(unsigned* out) {
  __shared__ unsigned s[64];
  neighbours(s, out, true);
}
__global__ void racy_neighbour_kernel(unsigned* out) {
  __shared__ unsigned s[64];
  neighbours(s, out, false);
}

std::vector<unsigned> run_neighbours(bool barrier) {
  unsigned* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, 64 * sizeof(unsigned)), cudaSuccess);
  DQ_LAUNCH(barrier ? neighbour_kernel : racy_neighbour_kernel, 1, 64, 0, nullptr)(d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  auto h = get(d, 64);
  cudaFree(d);
  return h;
}

// The threads whose neighbour value is wrong.
std::vector<unsigned> wrong_neighbours(const std::vector<unsigned>& h) {
  std::vector<unsigned> w;
  for (unsigned t = 0; t < 64; ++t)
    if (h[t] != ((t + 1) % 64) * 7 + 1) w.push_back(t);
  return w;
}

TEST(CudaEmulator, AMissingBarrierShowsInBothOrders) {
  BothOrders restore;
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    EXPECT_TRUE(wrong_neighbours(run_neighbours(true)).empty()) << "with the barrier, reverse=" << rev;
  }
  // without it, in index order every thread but the last reads before its
  // neighbour wrote; in reverse order only the last thread does (thread 0 runs last)
  std::vector<unsigned> all_but_last(63);
  for (unsigned t = 0; t < 63; ++t) all_but_last[t] = t;
  set_reverse_order(false);
  EXPECT_EQ(wrong_neighbours(run_neighbours(false)), all_but_last);
  set_reverse_order(true);
  EXPECT_EQ(wrong_neighbours(run_neighbours(false)), std::vector<unsigned>{63});
}

// Block b copies what block b - 1 wrote, with nothing that orders the blocks:
// a bug on a GPU, which schedules blocks in any order.
__global__ void chained_blocks_kernel(unsigned* d) {
  if (threadIdx.x != 0) return;
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  d[b + 1] = d[b] + 1;
}

TEST(CudaEmulator, BlocksRunInEitherOrderSoABlockChainShowsInOne) {
  BothOrders restore;
  std::vector<unsigned> seen[2];
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    unsigned* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 25 * sizeof(unsigned)), cudaSuccess);
    ASSERT_EQ(cudaMemset(d, 0, 25 * sizeof(unsigned)), cudaSuccess);
    DQ_LAUNCH(chained_blocks_kernel, dim3(2, 3, 4), 32, 0, nullptr)(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    seen[rev] = get(d, 25);
    cudaFree(d);
  }
  // index order: each block sees its predecessor's value, 0, 1, ..., 24; reverse: every block
  // runs before its predecessor and copies a 0, so all but d[0] are 1 (and blockIdx covers
  // every (x, y, z) of the 2 x 3 x 4 grid once either way)
  std::vector<unsigned> chain(25), stale(25, 1);
  for (unsigned i = 0; i < 25; ++i) chain[i] = i;
  stale[0] = 0;
  EXPECT_EQ(seen[0], chain);
  EXPECT_EQ(seen[1], stale);
}

__global__ void atomic_kernel(unsigned* out) {
  __shared__ unsigned count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  atomicAdd(&count, 1u);
  atomicMax(out + 1, threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(out, count);
}

TEST(CudaEmulator, AtomicsAndSharedMemoryAcrossBlocks) {
  BothOrders restore;
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    unsigned* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 2 * sizeof(unsigned)), cudaSuccess);
    ASSERT_EQ(cudaMemset(d, 0, 2 * sizeof(unsigned)), cudaSuccess);
    DQ_LAUNCH(atomic_kernel, 5, 96, 0, nullptr)(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(get(d, 2), (std::vector<unsigned>{5 * 96, 95}));
    cudaFree(d);
  }
}

// Thread 0 reads a shared variable before writing it.
__global__ void stale_kernel(unsigned* out) {
  __shared__ unsigned v;
  if (threadIdx.x == 0) {
    out[blockIdx.x] = v;
    v = 7;
  }
}

TEST(CudaEmulator, SharedMemoryStartsUndefinedInEveryBlock) {
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 3 * sizeof(unsigned)), cudaSuccess);
  DQ_LAUNCH(stale_kernel, 2, 4, 0, nullptr)(d);
  DQ_LAUNCH(stale_kernel, 1, 4, 0, nullptr)(d + 2);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(get(d, 3), std::vector<unsigned>(3, 0xA5A5A5A5u)) << "a block saw an earlier block's value";
  cudaFree(d);
}

// Odd threads return before the barrier the even ones wait at.
__global__ void divergent_kernel(unsigned* out) {
  if (threadIdx.x % 2) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

TEST(CudaEmulator, ABarrierNotEveryThreadReachesFailsTheLaunch) {
  BothOrders restore;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 32 * sizeof(unsigned)), cudaSuccess);
  testing::internal::CaptureStderr();
  DQ_LAUNCH(divergent_kernel, 2, 32, 0, nullptr)(d);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure) << "a failed launch is sticky";
  EXPECT_NE(err.find("__syncthreads"), std::string::npos) << err;
  reset_errors();
  cudaFree(d);
}

__global__ void touch_kernel(unsigned* out) { out[0] = 1; }

TEST(CudaEmulator, BadLaunchConfigurationsRunNothing) {
  BothOrders restore;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, sizeof(unsigned)), cudaSuccess);
  struct Bad {
    dim3 grid, block;
    size_t smem;
  };
  const Bad bad[] = {{0, 32, 0}, {1, 0, 0}, {1, 1025, 0}, {dim3(1, 65536), 32, 0}, {1, 32, (48 << 10) + 1}};
  testing::internal::CaptureStderr();
  for (const Bad& b : bad) {
    DQ_LAUNCH(touch_kernel, b.grid, b.block, b.smem, nullptr)(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error is not sticky";
  }
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(get(d, 1)[0], 0u);
  DQ_LAUNCH(touch_kernel, 1, 1024, 48 << 10, nullptr)(d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(get(d, 1)[0], 1u);
  cudaFree(d);
}

TEST(CudaEmulator, DeviceMemoryIsAlignedUnzeroedAndChecked) {
  unsigned char* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1000), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 256, 0u);
  const auto h = get(d, 1000);
  EXPECT_EQ(h[0], 0xA5) << "fresh device memory is not zeroed";
  std::vector<unsigned char> host(2000, 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(cudaMemcpy(d, host.data(), 1001, cudaMemcpyHostToDevice), cudaErrorInvalidValue) << "past the end";
  EXPECT_EQ(cudaMemcpy(d + 1, host.data(), 1000, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), d, 10, cudaMemcpyHostToDevice), cudaErrorInvalidValue) << "swapped direction";
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 100, 10, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(host.data(), 0, 10), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidDevicePointer);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaMemcpy(d + 999, host.data(), 1, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  reset_errors();
}

__global__ void write_at_kernel(unsigned char* p, size_t i) { p[i] = 0; }

TEST(CudaEmulator, WritesPastAnAllocationAreCaught) {
  // within the alignment slack: cudaFree finds the canary overwritten
  unsigned char* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1000), cudaSuccess);
  DQ_LAUNCH(write_at_kernel, 1, 1, 0, nullptr)(d, 1003);
  testing::internal::CaptureStderr();
  cudaFree(d);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("past its end"), std::string::npos);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  reset_errors();
  // beyond the slack: the guard page
  EXPECT_DEATH(
      {
        unsigned char* e = nullptr;
        cudaMalloc(&e, 1000);
        DQ_LAUNCH(write_at_kernel, 1, 1, 0, nullptr)(e, 1000 + 256);
      },
      "");
}

__global__ void smem_kernel(size_t i) {
  DQ_DYNAMIC_SMEM(sm);
  sm[i] = 0;
}

TEST(CudaEmulator, DynamicSharedMemoryEndsAtAGuardPage) {
  DQ_LAUNCH(smem_kernel, 1, 1, 4096, nullptr)(size_t(4095));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_DEATH(DQ_LAUNCH(smem_kernel, 1, 1, 4096, nullptr)(size_t(4096)), "");
}

}  // namespace
