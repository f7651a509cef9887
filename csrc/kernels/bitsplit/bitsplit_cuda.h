// CUDA launchers of the bit-split codec (cuda/bitsplit_kernels.cu): thin
// kernels, one thread per group, over the same __host__ __device__ functions
// as the CPU codec (bitsplit_format.h), so a block compressed on the GPU has
// the same bytes as on the CPU (same Philox streams). Only for builds with
// DYNAMIQ_WITH_CUDA; compiled with nvcc in CI and run there on the CPU
// emulation of CUDA (tests/cpp/cuda_emu); never run on a GPU.
//
// A block is the element range [e0, e1) of a bucket (e0 a multiple of the
// group size), exactly the elements the CPU codec puts in one message. All
// pointers are device pointers; `x` / `y` point at element e0 (bucket dtype
// f.dtype, or float32 when x_is_f32: a partial-sum accumulator), `acc` at a
// float32 array of ceil((e1 - e0) / G) * G values. `bad` (may be null) is a
// device int set to 1 when a received spike index is out of range (the host
// then raises MalformedMessage). Message sizes are checked by the host caller
// (bitsplit_layout(f, ng).total) before launching.
#pragma once

#include <cuda_runtime.h>

#include "kernels/bitsplit/bitsplit_format.h"

namespace dynamiq {

struct BitsplitCudaBlock {
  BitsplitFormat f;
  int64_t e0 = 0, e1 = 0;
};

cudaError_t bitsplit_compress_cuda(const BitsplitCudaBlock& b, const void* x, bool x_is_f32,
                                   RngKey key, uint32_t rank, bool stochastic, uint8_t* out,
                                   cudaStream_t stream);

// y[i] = dtype_round(value_i / divisor) for i in [0, e1 - e0).
cudaError_t bitsplit_decompress_cuda(const BitsplitCudaBlock& b, const uint8_t* in, void* y,
                                     float divisor, int* bad, cudaStream_t stream);

// acc[i] = x[i] + value_i (x may alias acc when x_is_f32).
cudaError_t bitsplit_decompress_accumulate_cuda(const BitsplitCudaBlock& b, const uint8_t* in,
                                                const void* x, bool x_is_f32, float* acc, int* bad,
                                                cudaStream_t stream);

// y[i] = dtype_round((x[i] + value_i) / divisor): the reduce-scatter sink.
cudaError_t bitsplit_decompress_accumulate_output_cuda(const BitsplitCudaBlock& b, const uint8_t* in,
                                                       const void* x, bool x_is_f32, void* y, float divisor,
                                                       int* bad, cudaStream_t stream);

// out <- compress(x + decompress(in)), fused per group.
cudaError_t bitsplit_decompress_accumulate_recompress_cuda(const BitsplitCudaBlock& b,
                                                           const uint8_t* in, const void* x,
                                                           bool x_is_f32, RngKey key, uint32_t rank,
                                                           bool stochastic, uint8_t* out, int* bad,
                                                           cudaStream_t stream);

}  // namespace dynamiq
