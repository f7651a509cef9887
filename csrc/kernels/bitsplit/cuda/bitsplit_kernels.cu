// CUDA kernels of the bit-split codec: one thread per group, each a thin
// wrapper over the shared __host__ __device__ functions of bitsplit_format.h
// (the same ones the CPU codec runs), so the bytes and values are the CPU's.
// Correctness over speed: a group's values live in per-thread local memory.
#include "kernels/bitsplit/bitsplit_cuda.h"
#include "kernels/base/cuda/launch.h"

namespace dynamiq {
namespace {

constexpr int kThreads = 128;

template <DType T>
__device__ float load_x(const void* x, bool x_is_f32, int64_t i) {
  if (x_is_f32) return static_cast<const float*>(x)[i];
  return DTypeTraits<T>::load(static_cast<const typename DTypeTraits<T>::storage*>(x), i);
}

__device__ int group_count(const BitsplitCudaBlock& b, int64_t gi) {
  const int64_t left = b.e1 - b.e0 - gi * b.f.group;
  return int(left < b.f.group ? left : b.f.group);
}

template <DType T>
__global__ void compress_kernel(BitsplitCudaBlock b, BitsplitLayout lay, const void* x,
                                bool x_is_f32, RngKey key, uint32_t rank, bool stochastic,
                                uint8_t* out) {
  const int64_t gi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gi >= lay.ng) return;
  const int G = b.f.group, cnt = group_count(b, gi);
  float v[kBitsplitMaxGroup], u[kBitsplitMaxGroup];
  uint8_t codes[kBitsplitMaxGroup];
  for (int i = 0; i < G; ++i) v[i] = i < cnt ? load_x<T>(x, x_is_f32, gi * G + i) : 0.0f;
  bitsplit_encode_group(v, cnt, b.e0 + gi * G, gi, b.f, lay, stochastic, key, rank, u, codes, out);
}

template <DType T>
__global__ void decompress_kernel(BitsplitCudaBlock b, BitsplitLayout lay, const uint8_t* in,
                                  void* y, float divisor, int* bad) {
  const int64_t gi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gi >= lay.ng) return;
  const int G = b.f.group, cnt = group_count(b, gi);
  float v[kBitsplitMaxGroup];
  uint8_t codes[kBitsplitMaxGroup];
  if (!bitsplit_decode_group(in, lay, b.f, gi, cnt, codes, v) && bad) *bad = 1;
  auto* dst = static_cast<typename DTypeTraits<T>::storage*>(y);
  for (int i = 0; i < cnt; ++i) {
    float val = v[i];
    if (divisor != 1.0f) val /= divisor;  // as store_unit: one IEEE division
    DTypeTraits<T>::store(dst, gi * G + i, val);
  }
}

template <DType T>
__global__ void decompress_accumulate_kernel(BitsplitCudaBlock b, BitsplitLayout lay,
                                             const uint8_t* in, const void* x, bool x_is_f32,
                                             float* acc, int* bad) {
  const int64_t gi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gi >= lay.ng) return;
  const int G = b.f.group, cnt = group_count(b, gi);
  float v[kBitsplitMaxGroup];
  uint8_t codes[kBitsplitMaxGroup];
  if (!bitsplit_decode_group(in, lay, b.f, gi, cnt, codes, v) && bad) *bad = 1;
  for (int i = 0; i < G; ++i) {
    const float xi = i < cnt ? load_x<T>(x, x_is_f32, gi * G + i) : 0.0f;
    acc[gi * G + i] = xi + v[i];
  }
}

template <DType T>
__global__ void decompress_accumulate_output_kernel(BitsplitCudaBlock b, BitsplitLayout lay,
                                                    const uint8_t* in, const void* x, bool x_is_f32,
                                                    void* y, float divisor, int* bad) {
  const int64_t gi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gi >= lay.ng) return;
  const int G = b.f.group, cnt = group_count(b, gi);
  float v[kBitsplitMaxGroup];
  uint8_t codes[kBitsplitMaxGroup];
  if (!bitsplit_decode_group(in, lay, b.f, gi, cnt, codes, v) && bad) *bad = 1;
  auto* dst = static_cast<typename DTypeTraits<T>::storage*>(y);
  for (int i = 0; i < cnt; ++i) {
    float val = load_x<T>(x, x_is_f32, gi * G + i) + v[i];
    if (divisor != 1.0f) val /= divisor;  // as store_unit: one IEEE division
    DTypeTraits<T>::store(dst, gi * G + i, val);
  }
}

template <DType T>
__global__ void dar_kernel(BitsplitCudaBlock b, BitsplitLayout lay, const uint8_t* in,
                           const void* x, bool x_is_f32, RngKey key, uint32_t rank,
                           bool stochastic, uint8_t* out, int* bad) {
  const int64_t gi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gi >= lay.ng) return;
  const int G = b.f.group, cnt = group_count(b, gi);
  float v[kBitsplitMaxGroup], u[kBitsplitMaxGroup];
  uint8_t codes[kBitsplitMaxGroup];
  if (!bitsplit_decode_group(in, lay, b.f, gi, cnt, codes, v) && bad) *bad = 1;
  for (int i = 0; i < G; ++i) v[i] = (i < cnt ? load_x<T>(x, x_is_f32, gi * G + i) : 0.0f) + v[i];
  bitsplit_encode_group(v, cnt, b.e0 + gi * G, gi, b.f, lay, stochastic, key, rank, u, codes, out);
}

BitsplitLayout layout_of(const BitsplitCudaBlock& b) {
  const int64_t n = b.e1 > b.e0 ? b.e1 - b.e0 : 0;
  return bitsplit_layout(b.f, (n + b.f.group - 1) / b.f.group);
}

unsigned grid_of(const BitsplitLayout& lay) { return unsigned((lay.ng + kThreads - 1) / kThreads); }

}  // namespace

#define DQ_BITSPLIT_LAUNCH(KERNEL, ...)                                                \
  do {                                                                                  \
    const BitsplitLayout lay = layout_of(b);                                            \
    if (lay.ng == 0) return cudaSuccess;                                                \
    DQ_DISPATCH_DTYPE(b.f.dtype, T, [&] {                                               \
      DQ_LAUNCH(KERNEL<T>, grid_of(lay), kThreads, 0, stream)(b, lay, __VA_ARGS__);            \
    });                                                                                 \
    return cudaGetLastError();                                                          \
  } while (0)

cudaError_t bitsplit_compress_cuda(const BitsplitCudaBlock& b, const void* x, bool x_is_f32,
                                   RngKey key, uint32_t rank, bool stochastic, uint8_t* out,
                                   cudaStream_t stream) {
  DQ_BITSPLIT_LAUNCH(compress_kernel, x, x_is_f32, key, rank, stochastic, out);
}

cudaError_t bitsplit_decompress_cuda(const BitsplitCudaBlock& b, const uint8_t* in, void* y,
                                     float divisor, int* bad, cudaStream_t stream) {
  DQ_BITSPLIT_LAUNCH(decompress_kernel, in, y, divisor, bad);
}

cudaError_t bitsplit_decompress_accumulate_cuda(const BitsplitCudaBlock& b, const uint8_t* in,
                                                const void* x, bool x_is_f32, float* acc, int* bad,
                                                cudaStream_t stream) {
  DQ_BITSPLIT_LAUNCH(decompress_accumulate_kernel, in, x, x_is_f32, acc, bad);
}

cudaError_t bitsplit_decompress_accumulate_output_cuda(const BitsplitCudaBlock& b, const uint8_t* in,
                                                       const void* x, bool x_is_f32, void* y, float divisor,
                                                       int* bad, cudaStream_t stream) {
  DQ_BITSPLIT_LAUNCH(decompress_accumulate_output_kernel, in, x, x_is_f32, y, divisor, bad);
}

cudaError_t bitsplit_decompress_accumulate_recompress_cuda(const BitsplitCudaBlock& b,
                                                           const uint8_t* in, const void* x,
                                                           bool x_is_f32, RngKey key, uint32_t rank,
                                                           bool stochastic, uint8_t* out, int* bad,
                                                           cudaStream_t stream) {
  DQ_BITSPLIT_LAUNCH(dar_kernel, in, x, x_is_f32, key, rank, stochastic, out, bad);
}

}  // namespace dynamiq
