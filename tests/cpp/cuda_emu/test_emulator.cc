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

// ---- warps ---------------------------------------------------------------------------

__device__ unsigned lane_id() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % warpSize;
}
__device__ unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// A value per thread with bits above 32 (a 64-bit shuffle must move both halves).
__device__ unsigned long long scan_input(unsigned g) { return (1ull << 40) * (g % 5) + g * 7 + 3; }

// Inclusive prefix sums over segments of `width` lanes by __shfl_up_sync, in
// 32 and 64 bits; out: 2 words per thread.
__global__ void warp_scan_kernel(unsigned long long* out, int width) {
  const unsigned g = blockIdx.x * blockDim.x + linear_tid(), lane = lane_id();
  unsigned long long x = scan_input(g);
  unsigned y = unsigned(g * 13 + 1);
  for (int d = 1; d < width; d *= 2) {
    const unsigned long long xu = __shfl_up_sync(0xffffffffu, x, unsigned(d), width);
    const unsigned yu = __shfl_up_sync(0xffffffffu, y, unsigned(d), width);
    if (int(lane % unsigned(width)) >= d) {
      x += xu;
      y += yu;
    }
  }
  out[2 * g] = x;
  out[2 * g + 1] = y;
}

TEST(CudaEmulatorWarps, InclusiveScanByShflUpIsTheSerialPrefixSum) {
  BothOrders restore;
  const unsigned blocks = 2, threads = 96, n = blocks * threads;
  unsigned long long* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * n * sizeof(unsigned long long)), cudaSuccess);
  for (bool rev : {false, true})
    for (int width : {32, 8}) {
      set_reverse_order(rev);
      DQ_LAUNCH(warp_scan_kernel, blocks, threads, 0, nullptr)(d, width);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      const auto h = get(d, 2 * n);
      unsigned long long sx = 0;
      unsigned sy = 0;
      for (unsigned g = 0; g < n; ++g) {
        if (g % unsigned(width) == 0) sx = sy = 0;
        sx += (1ull << 40) * (g % 5) + g * 7 + 3;
        sy += g * 13 + 1;
        ASSERT_EQ(h[2 * g], sx) << "thread " << g << " width " << width << " reverse " << rev;
        ASSERT_EQ(h[2 * g + 1], sy) << "thread " << g << " width " << width << " reverse " << rev;
      }
    }
  cudaFree(d);
}

// A butterfly reduction by __shfl_xor_sync (every lane gets the warp's sum),
// then one xor step across 16-lane segments (width 16): a lane of the upper
// half reads the lower half's lane, one of the lower half keeps its own value.
__global__ void butterfly_kernel(double* out) {
  const unsigned lane = lane_id(), t = linear_tid();
  double v = 1.0 + t * 0.5;
  for (int m = 16; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  out[2 * t] = v;
  out[2 * t + 1] = __shfl_xor_sync(0xffffffffu, float(lane), 16, 16);
}

TEST(CudaEmulatorWarps, ButterflyReductionByShflXor) {
  BothOrders restore;
  double* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * 64 * sizeof(double)), cudaSuccess);
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    DQ_LAUNCH(butterfly_kernel, 1, 64, 0, nullptr)(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const auto h = get(d, 128);
    for (unsigned t = 0; t < 64; ++t) {
      double sum = 0;  // exact in doubles: multiples of 0.5
      for (unsigned u = t / 32 * 32; u < t / 32 * 32 + 32; ++u) sum += 1.0 + u * 0.5;
      EXPECT_EQ(h[2 * t], sum) << t;
      const unsigned lane = t % 32;
      EXPECT_EQ(h[2 * t + 1], double(lane < 16 ? lane : lane - 16)) << t;
    }
  }
  cudaFree(d);
}

// Votes, matches, reductions and shuffles within segments; out: 12 words per thread.
__global__ void vote_kernel(unsigned* out) {
  const unsigned lane = lane_id(), t = linear_tid();
  unsigned* o = out + 12 * t;
  o[0] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  o[1] = unsigned(__any_sync(0xffffffffu, lane == 17)) | unsigned(__any_sync(0xffffffffu, 0)) << 1;
  o[2] = unsigned(__all_sync(0xffffffffu, lane < 32)) | unsigned(__all_sync(0xffffffffu, lane != 9)) << 1;
  o[3] = __match_any_sync(0xffffffffu, lane % 4 == 1 ? 7ll : (long long)lane << 36);
  int pred = 0;
  o[4] = __match_all_sync(0xffffffffu, 5u, &pred) ^ unsigned(pred) << 31;
  o[5] = __match_all_sync(0xffffffffu, float(lane / 31), &pred) | unsigned(pred);
  o[6] = __reduce_add_sync(0xffffffffu, lane + 1);
  o[7] = unsigned(__reduce_min_sync(0xffffffffu, int(lane) - 5)) ^ __reduce_max_sync(0xffffffffu, lane * 3);
  o[8] = __shfl_sync(0xffffffffu, t * 10, 5);  // lane 5 of the warp
  o[9] = __shfl_sync(0xffffffffu, t, -1, 8);    // the last lane of each 8-lane segment
  o[10] = __shfl_up_sync(0xffffffffu, lane, 3, 8);
  o[11] = __shfl_down_sync(0xffffffffu, lane, 3, 8);
}

TEST(CudaEmulatorWarps, BallotAnyAllMatchAndReduceOnAPattern) {
  BothOrders restore;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 12 * 64 * sizeof(unsigned)), cudaSuccess);
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    DQ_LAUNCH(vote_kernel, 1, 64, 0, nullptr)(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const auto h = get(d, 12 * 64);
    for (unsigned t = 0; t < 64; ++t) {
      const unsigned lane = t % 32, base = t - lane;
      const unsigned* o = &h[12 * t];
      EXPECT_EQ(o[0], 0x49249249u) << t;  // lanes 0, 3, 6, ..., 30
      EXPECT_EQ(o[1], 1u) << t;
      EXPECT_EQ(o[2], 1u) << t;
      EXPECT_EQ(o[3], lane % 4 == 1 ? 0x22222222u : 1u << lane) << t;
      EXPECT_EQ(o[4], 0xffffffffu ^ 0x80000000u) << t;
      EXPECT_EQ(o[5], 0u) << t;  // lane 31 differs: no match, pred 0
      EXPECT_EQ(o[6], 32u * 33u / 2u) << t;
      EXPECT_EQ(o[7], unsigned(-5) ^ 93u) << t;
      EXPECT_EQ(o[8], (base + 5) * 10) << t;
      EXPECT_EQ(o[9], base + lane / 8 * 8 + 7) << t;
      // up and down do not cross a segment's edge: the lane keeps its own value
      EXPECT_EQ(o[10], lane % 8 >= 3 ? lane - 3 : lane) << t;
      EXPECT_EQ(o[11], lane % 8 < 5 ? lane + 3 : lane) << t;
    }
  }
  cudaFree(d);
}

// The first 16 lanes shift down by one within their mask; lane 15 reads lane 16,
// outside the mask: undefined on a GPU, poison here.
__global__ void half_mask_kernel(unsigned* out) {
  const unsigned lane = lane_id();
  out[lane] = 0;
  if (lane < 16) out[lane] = __shfl_down_sync(0x0000ffffu, lane * 3 + 1, 1);
}
// Every lane calls with the first 16 lanes' mask: lane 16 is not in it.
__global__ void outside_mask_kernel(unsigned* out) { out[lane_id()] = __shfl_down_sync(0x0000ffffu, 1u, 1); }

std::string failing_launch(void (*kernel)(unsigned*), unsigned threads) {
  unsigned* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, 1024 * sizeof(unsigned)), cudaSuccess);
  testing::internal::CaptureStderr();
  DQ_LAUNCH(kernel, 2, threads, 0, nullptr)(d);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << err;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure) << "a failed launch is sticky";
  reset_errors();
  cudaFree(d);
  return err;
}

TEST(CudaEmulatorWarps, APartialMaskWorksAndALaneOutsideItFailsTheLaunch) {
  BothOrders restore;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 32 * sizeof(unsigned)), cudaSuccess);
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    DQ_LAUNCH(half_mask_kernel, 1, 32, 0, nullptr)(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const auto h = get(d, 32);
    for (unsigned l = 0; l < 15; ++l) EXPECT_EQ(h[l], (l + 1) * 3 + 1) << l;
    EXPECT_EQ(h[15], 0xA5A5A5A5u) << "a read of a lane outside the mask";
    for (unsigned l = 16; l < 32; ++l) EXPECT_EQ(h[l], 0u) << l;
    const std::string err = failing_launch(outside_mask_kernel, 32);
    EXPECT_NE(err.find(rev ? "does not name the calling lane 31" : "does not name the calling lane 16"),
              std::string::npos)
        << err;
  }
  cudaFree(d);
}

// Lanes that wait at different sync points: nothing can go on (a GPU hangs or
// computes garbage); the launch fails instead.
__global__ void split_warp_kernel(unsigned* out) {
  if (lane_id() < 16)
    __syncwarp();
  else
    out[lane_id()] = __shfl_sync(0xffffffffu, 1u, 0);
}
__global__ void warp_vs_block_kernel(unsigned* out) {
  if (linear_tid() == 40)
    __syncthreads();
  else
    __syncwarp();
}
__global__ void exited_lane_kernel(unsigned* out) {
  if (lane_id() == 31) return;  // e.g. a bounds check before a full-warp reduction
  out[lane_id()] = __reduce_add_sync(0xffffffffu, 1u);
}

TEST(CudaEmulatorWarps, LanesAtDifferentSyncPointsFailTheLaunch) {
  BothOrders restore;
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    std::string err = failing_launch(split_warp_kernel, 64);
    EXPECT_NE(err.find("never reaches"), std::string::npos) << err;
    EXPECT_NE(err.find("__syncwarp"), std::string::npos) << err;
    EXPECT_NE(err.find("__shfl_sync"), std::string::npos) << err;
    err = failing_launch(warp_vs_block_kernel, 64);
    EXPECT_NE(err.find("__syncthreads"), std::string::npos) << err;
    err = failing_launch(exited_lane_kernel, 64);
    EXPECT_NE(err.find("exited"), std::string::npos) << err;
  }
}

// A block of 48 threads: its second warp has 16 lanes, and a mask must name only those.
__global__ void partial_warp_kernel(unsigned* out) {
  const unsigned t = linear_tid(), mask = __activemask();
  out[2 * t] = mask;
  out[2 * t + 1] = __reduce_add_sync(mask, t) + __ballot_sync(mask, t % 2);
}
__global__ void full_mask_in_partial_warp_kernel(unsigned* out) { __syncwarp(); }

TEST(CudaEmulatorWarps, ThePartialLastWarpOfABlock) {
  BothOrders restore;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 96 * sizeof(unsigned)), cudaSuccess);
  for (bool rev : {false, true}) {
    set_reverse_order(rev);
    DQ_LAUNCH(partial_warp_kernel, 1, dim3(8, 6), 0, nullptr)(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const auto h = get(d, 96);
    for (unsigned t = 0; t < 48; ++t) {
      const bool last = t >= 32;
      EXPECT_EQ(h[2 * t], last ? 0xffffu : 0xffffffffu) << t;
      const unsigned sum = last ? (32 + 47) * 16 / 2 : 31 * 32 / 2;
      EXPECT_EQ(h[2 * t + 1], sum + (last ? 0xaaaau : 0xaaaaaaaau)) << t;
    }
    const std::string err = failing_launch(full_mask_in_partial_warp_kernel, 48);
    EXPECT_NE(err.find("lanes the block does not have"), std::string::npos) << err;
  }
  cudaFree(d);
}

// Each lane writes its slot of shared memory, then reads its neighbour's: correct only with the
// __syncwarp in between.
__device__ void warp_neighbours(unsigned* s, unsigned* out, bool sync) {
  const unsigned lane = lane_id();
  s[lane] = lane * 5 + 2;
  if (sync) __syncwarp();
  out[lane] = s[(lane + 1) % 32];
}
__global__ void warp_neighbour_kernel(unsigned* out) {
  __shared__ unsigned s[32];
  warp_neighbours(s, out, true);
}
__global__ void racy_warp_neighbour_kernel(unsigned* out) {
  __shared__ unsigned s[32];
  warp_neighbours(s, out, false);
}

TEST(CudaEmulatorWarps, AMissingSyncwarpShowsInOneOrder) {
  BothOrders restore;
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 32 * sizeof(unsigned)), cudaSuccess);
  unsigned wrong[2][2] = {};
  for (bool rev : {false, true})
    for (bool sync : {false, true}) {
      set_reverse_order(rev);
      DQ_LAUNCH(sync ? warp_neighbour_kernel : racy_warp_neighbour_kernel, 1, 32, 0, nullptr)(d);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      const auto h = get(d, 32);
      for (unsigned l = 0; l < 32; ++l) wrong[rev][sync] += h[l] != ((l + 1) % 32) * 5 + 2;
    }
  EXPECT_EQ(wrong[0][1] + wrong[1][1], 0u);
  EXPECT_EQ(wrong[0][0], 31u) << "index order: every lane but the last reads before its neighbour writes";
  EXPECT_EQ(wrong[1][0], 1u) << "reverse order: lane 31 reads lane 0's slot before it is written";
  cudaFree(d);
}

__global__ void block_vote_kernel(unsigned* out) {
  const unsigned t = linear_tid();
  const int c = __syncthreads_count(t % 5 == 0);
  const int a = __syncthreads_and(t < 100);
  const int o = __syncthreads_or(t == 99);
  const int none = __syncthreads_or(0);
  out[t] = unsigned(c) * 1000 + unsigned(a) * 100 + unsigned(o) * 10 + unsigned(none);
}

TEST(CudaEmulatorWarps, SyncthreadsCountAndOr) {
  unsigned* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 100 * sizeof(unsigned)), cudaSuccess);
  DQ_LAUNCH(block_vote_kernel, 1, 100, 0, nullptr)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(get(d, 100), std::vector<unsigned>(100, 20 * 1000 + 100 + 10));
  cudaFree(d);
}

TEST(CudaEmulatorWarps, IntegerIntrinsicsFollowCudasDefinitions) {
  EXPECT_EQ(__popc(0xf0f00001u), 9);
  EXPECT_EQ(__popcll(0xffffffff00000001ull), 33);
  EXPECT_EQ(__clz(0), 32);
  EXPECT_EQ(__clz(1), 31);
  EXPECT_EQ(__clz(-1), 0);
  EXPECT_EQ(__clzll(1), 63);
  EXPECT_EQ(__clzll(0), 64);
  EXPECT_EQ(__ffs(0), 0);
  EXPECT_EQ(__ffs(8), 4);
  EXPECT_EQ(__ffsll(1ll << 40), 41);
  EXPECT_EQ(__brev(1u), 0x80000000u);
  EXPECT_EQ(__brev(0x12345678u), 0x1e6a2c48u);
  EXPECT_EQ(__brevll(3ull), 0xc000000000000000ull);
  // bytes of y:x = 77 66 55 44 33 22 11 00; selectors 0, 4, 1, 5 (bit 3 of each ignored)
  EXPECT_EQ(__byte_perm(0x33221100u, 0x77665544u, 0x5140u), 0x55114400u);
  EXPECT_EQ(__byte_perm(0x33221100u, 0x77665544u, 0xffff8888u), 0x00000000u);
  EXPECT_EQ(__funnelshift_l(0x89abcdefu, 0x01234567u, 4), 0x12345678u);
  EXPECT_EQ(__funnelshift_l(0x89abcdefu, 0x01234567u, 36), 0x12345678u);
  EXPECT_EQ(__funnelshift_lc(0x89abcdefu, 0x01234567u, 36), 0x89abcdefu);
  EXPECT_EQ(__funnelshift_r(0x89abcdefu, 0x01234567u, 4), 0x789abcdeu);
  EXPECT_EQ(__funnelshift_rc(0x89abcdefu, 0x01234567u, 40), 0x01234567u);
}

// 16-byte vector loads, from an aligned address and from one 4 bytes past it.
__global__ void float4_kernel(const float* in, float* out, int offset) {
  const float4 v = *reinterpret_cast<const float4*>(in + offset);
  out[0] = v.x + v.y + v.z + v.w;
}

TEST(CudaEmulatorWarps, VectorTypesHaveCudasAlignmentAndAMisalignedLoadFails) {
  static_assert(alignof(float4) == 16 && alignof(uint4) == 16 && alignof(int4) == 16, "16-byte types");
  static_assert(alignof(float2) == 8 && alignof(uint2) == 8 && alignof(ushort4) == 8, "8-byte types");
  static_assert(alignof(ushort2) == 4 && alignof(uchar4) == 4 && sizeof(uchar4) == 4, "4-byte types");
  EXPECT_EQ(make_uint4(1, 2, 3, 4).w, 4u);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16 * sizeof(float)), cudaSuccess);
  const std::vector<float> h{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  ASSERT_EQ(cudaMemcpy(d, h.data(), 16 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  DQ_LAUNCH(float4_kernel, 1, 1, 0, nullptr)(d + 4, d + 15, 0);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(get(d + 15, 1)[0], 5.f + 6 + 7 + 8);
  EXPECT_DEATH(DQ_LAUNCH(float4_kernel, 1, 1, 0, nullptr)(d + 4, d + 15, 1), "misaligned address");
  cudaFree(d);
}

}  // namespace
