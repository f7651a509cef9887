// Device pieces shared by the lossless kernels (lossless_encode_kernels.cu,
// lossless_plan_kernel.cu, lossless_decode_kernels.cu): warp and block scans written
// over __shfl_*_sync, the encode's device state, and the few intrinsics the
// kernels use, spelled so that they compile with nvcc and with the host
// compiler of the CPU emulation of CUDA (tests/cpp/cuda_emu).
//
// The scans are written by hand on purpose: CUB's WarpScan / BlockScan do not
// compile on the emulation, which must run these very kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/base/common.h"
#include "kernels/lossless/lossless_format.h"

#if defined(DYNAMIQ_CUDA_EMULATION) && !defined(__launch_bounds__)
#define __launch_bounds__(...)
#endif
#if defined(__CUDA_ARCH__)
#define DQ_UNROLL _Pragma("unroll")
#else
#define DQ_UNROLL
#endif

namespace dynamiq {

// The GPU encode's state in device memory (lossless_encode_cuda), one per
// stream. Zeroed once when allocated; every encode leaves `hist` and `done`
// zero again (plan_kernel and the last block of size_kernel clear them).
struct LosslessEncodeState {
  uint32_t hist[256];     // split_kernel: the body exponents' histogram
  uint32_t done;          // size_kernel: blocks finished (the last one scans)
  uint32_t format;        // plan_kernel: lossless::ExpFormat chosen
  int32_t prefix_bytes;   // zip / Huffman: the section's table bytes
  int32_t pad;
  int64_t bound;          // section bytes: exact (plain, const, zip), Huffman's bound
  uint8_t code_of[256];   // zip: exponent -> code 1..7, 0 = escape
  uint32_t huff[256];     // Huffman: reversed code | length << 16 (0: not in the block)
};

namespace lossless_dev {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Threads of the segment kernels' blocks: one warp per 1024-exponent segment.
constexpr int kSegThreads = 256;
constexpr int kSegWarps = kSegThreads / kWarp;
static_assert(lossless::kSegment == kWarp * 32, "a lane owns 32 exponents (4 groups) of a segment");
// The most bytes a valid Huffman segment's stream can take (every code kMaxCodeLen bits).
constexpr int kMaxStreamBytes = (lossless::kSegment * lossless::kMaxCodeLen + 7) / 8;

DQ_HD int popc32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// 1 + the index of x's lowest set bit (0 for x = 0), as __ffs.
DQ_HD int ffs32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __ffs(int(x));
#else
  return __builtin_ffs(int(x));
#endif
}
DQ_HD uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

__device__ inline int lane_id() { return int(threadIdx.x) & (kWarp - 1); }

DQ_HD bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// A T-sized load or store at an address aligned for T: one vector access on
// the device (a 16-byte T: LDG/STG.128); memcpy in the emulation.
template <class T>
__device__ inline T ldv(const void* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const T*>(p);
#else
  T v;
  memcpy(&v, p, sizeof v);
  return v;
#endif
}
template <class T>
__device__ inline void stv(void* p, const T& v) {
#if defined(__CUDA_ARCH__)
  *static_cast<T*>(p) = v;
#else
  memcpy(p, &v, sizeof v);
#endif
}

// Makes this thread's global writes visible to every block before what
// follows (the last-block pattern); the emulation runs blocks one by one.
__device__ inline void fence() {
#if defined(__CUDA_ARCH__)
  __threadfence();
#endif
}
// A load that bypasses L1 (the last block reads what other blocks wrote).
__device__ inline uint32_t load_cg(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *p;
#endif
}

// Inclusive prefix sum over the 32 lanes of a warp (every lane calls it).
template <class T>
__device__ inline T warp_inclusive_sum(T v) {
  const int lane = lane_id();
  DQ_UNROLL
  for (int d = 1; d < kWarp; d <<= 1) {
    const T u = __shfl_up_sync(kFullMask, v, d);
    if (lane >= d) v += u;
  }
  return v;
}
// The sum over the warp, in every lane.
template <class T>
__device__ inline T warp_sum(T v) {
  DQ_UNROLL
  for (int d = kWarp / 2; d > 0; d >>= 1) v += __shfl_xor_sync(kFullMask, v, d);
  return v;
}

// start[0..S) <- the exclusive prefix sums of value(0..S) (truncated to 32
// bits), start[S] <- their total; returns the total (64 bits) to every
// thread. Every thread of the block calls it (barriers); blockDim.x is a
// multiple of 32, at most 1024. part: blockDim.x / 32 + 1 shared counters.
template <class F>
__device__ unsigned long long block_scan(int64_t S, const F& value, uint32_t* start, unsigned long long* part) {
  const int tid = int(threadIdx.x), nt = int(blockDim.x), warp = tid / kWarp, nw = nt / kWarp;
  const int64_t chunk = (S + nt - 1) / nt;
  const int64_t s0 = chunk * tid < S ? chunk * tid : S, s1 = s0 + chunk < S ? s0 + chunk : S;
  unsigned long long sum = 0;
  for (int64_t s = s0; s < s1; ++s) sum += value(s);
  const unsigned long long incl = warp_inclusive_sum(sum);
  if (lane_id() == kWarp - 1) part[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const unsigned long long w = lane_id() < nw ? part[lane_id()] : 0;
    const unsigned long long wi = warp_inclusive_sum(w);
    __syncwarp();
    if (lane_id() < nw) part[lane_id()] = wi - w;
    if (lane_id() == kWarp - 1) part[nw] = wi;
  }
  __syncthreads();
  unsigned long long pos = part[warp] + incl - sum;
  for (int64_t s = s0; s < s1; ++s) {
    start[s] = uint32_t(pos);
    pos += value(s);
  }
  const unsigned long long total = part[nw];
  if (tid == 0) start[S] = uint32_t(total);
  __syncthreads();  // part is free again
  return total;
}

// Within a block: the number of threads before this one whose flag is set,
// and (in *total) how many have it. Every thread calls it (barriers);
// counts: blockDim.x / 32 shared ints.
__device__ inline int block_rank(bool flag, int* counts, int* total) {
  const int tid = int(threadIdx.x), warp = tid / kWarp, nw = int(blockDim.x) / kWarp;
  const unsigned b = __ballot_sync(kFullMask, flag);
  const int before_in_warp = popc32(b & ((1u << lane_id()) - 1u));
  if (lane_id() == 0) counts[warp] = popc32(b);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < nw; ++w) {
    if (w < warp) before += counts[w];
    all += counts[w];
  }
  __syncthreads();  // counts is free again
  *total = all;
  return before + before_in_warp;
}

}  // namespace lossless_dev
}  // namespace dynamiq
