// CUDA launchers of the lossless codec (cuda/lossless_kernels.cu): thin
// kernels over the __host__ __device__ functions of lossless_format.h, one
// thread per 8-value group (split, merge, plain planes) or per 1024-exponent
// segment (ZipCCL codes with their escapes, Huffman streams). Format choice
// and validation stay on the host (lossless_plan_encode, lossless_parse in
// lossless_codec.h), so a GPU message is byte-identical to the CPU one.
//
// All pointers are device pointers. Functions enqueue on `stream`; those that
// return a size or report malformed input synchronise it. CUDA failures raise
// dynamiq::Error, invalid segments raise MalformedMessage.
//
// Status: compiled with nvcc in CI; bit-equality with the CPU path is asserted
// by tests/cpp/cuda_lossless.cu, run in CI on the CPU emulation of CUDA
// (tests/cpp/cuda_emu); never run on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {

// Static part except the header (SM planes and tail, at msg + 16) and the 8G
// body exponents at exps.
void lossless_split_cuda(DType dtype, const void* values, int64_t n, uint8_t* msg, uint8_t* exps,
                         cudaStream_t stream);

// hist[256] (device, zeroed here) <- histogram of exps[0, m).
void lossless_histogram_cuda(const uint8_t* exps, int64_t m, unsigned long long* hist,
                             cudaStream_t stream);

// Writes the exponent section the plan chose at msg + static_bytes and
// returns its size (the header's dynamic_bytes). Synchronises.
size_t lossless_encode_section_cuda(DType dtype, const LosslessEncodePlan& plan, const uint8_t* exps,
                                    uint8_t* msg, cudaStream_t stream);

// exps <- the exponent section of a message parsed by lossless_parse.
// Synchronises; MalformedMessage if a segment's codes are invalid.
void lossless_decode_section_cuda(DType dtype, const LosslessDecodePlan& plan, const uint8_t* msg,
                                  uint8_t* exps, cudaStream_t stream);

// values <- the static part's SM planes and tail merged with exps.
void lossless_merge_cuda(DType dtype, const uint8_t* msg, const uint8_t* exps, int64_t n, void* values,
                         cudaStream_t stream);

}  // namespace dynamiq
