// CUDA launchers of the lossless codec (cuda/lossless_kernels.cu): thin
// kernels over the __host__ __device__ functions of lossless_format.h, one
// thread per 8-value group (split, merge, plain planes) or per 1024-exponent
// segment (ZipCCL codes with their escapes, Huffman streams). The format
// choice stays on the host (lossless_plan_encode in lossless_codec.h), so a
// GPU message is byte-identical to the CPU one; a received message is
// validated on the device by the host parse's own checks (lossless_validate.h).
//
// All pointers are device pointers. Functions enqueue on `stream`; those that
// return a size synchronise it. CUDA failures raise dynamiq::Error; the
// decode records a malformed message on the device (lossless_decode_cuda).
//
// Status: compiled with nvcc in CI; bit-equality with the CPU path is asserted
// by tests/cpp/cuda_lossless.cu, run in CI on the CPU emulation of CUDA
// (tests/cpp/cuda_emu); never run on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/lossless/lossless_codec.h"
#include "kernels/lossless/lossless_validate.h"

namespace dynamiq {

// Static part except the header (SM planes and tail, at msg + 16) and the 8G
// body exponents at exps.
void lossless_split_cuda(DType dtype, const void* values, int64_t n, uint8_t* msg, uint8_t* exps,
                         cudaStream_t stream);

// hist[256] (device, zeroed here) <- histogram of exps[0, m).
void lossless_histogram_cuda(const uint8_t* exps, int64_t m, unsigned long long* hist,
                             cudaStream_t stream);

// Device scratch of lossless_encode_section_cuda, owned by the caller and
// reused from call to call (in stream order).
struct LosslessEncodeScratch {
  uint8_t* tables = nullptr;   // 1024 bytes: zip code_of[256] | Huffman lengths[256] | codes (uint16)[256]
  uint32_t* sizes = nullptr;   // S: each segment's escapes / stream bytes
  uint32_t* start = nullptr;   // S + 1: their exclusive prefix sums and total (scanned on the device)
  uint32_t* total = nullptr;   // page-locked host memory the total is read into (null: a local)
};

// Writes the exponent section the plan chose at msg + static_bytes and
// returns its size (the header's dynamic_bytes). Zip and Huffman: the
// per-segment sizes are counted and scanned on the device and the section
// written before the one wait, for its total (4 bytes).
size_t lossless_encode_section_cuda(DType dtype, const LosslessEncodePlan& plan, const uint8_t* exps,
                                    uint8_t* msg, const LosslessEncodeScratch& scratch, cudaStream_t stream);
// The same with scratch allocated for the call.
size_t lossless_encode_section_cuda(DType dtype, const LosslessEncodePlan& plan, const uint8_t* exps,
                                    uint8_t* msg, cudaStream_t stream);

// What the device parse of a received message found (parse_kernel): the
// section decoders and the merge read it on the device.
struct LosslessDevicePlan {
  lossless::Fault fault{};  // the parse's refusal (kind kNone: parsed)
  int32_t codes_bad = 0;   // set by the section decoders: a segment's codes are invalid
  uint8_t format = 0;      // lossless::ExpFormat
  uint8_t constant = 0;
  uint8_t zip_table[8] = {};
  int64_t planes_offset = 0, payload_offset = 0, payload_bytes = 0;
};

// Device memory of lossless_decode_cuda, owned by the caller and reused
// from call to call (in stream order).
struct LosslessDecodeScratch {
  LosslessDevicePlan* plan = nullptr;  // one
  uint32_t* seg_start = nullptr;       // S + 1 (lossless::Layout::segments)
  uint16_t* table = nullptr;           // lossless::kDecodeTableSize
  uint8_t* exps = nullptr;             // body exponents (lossless::Layout::body)
  lossless::Fault* fault = nullptr;    // the first refusal since the caller zeroed it
};

// values <- the n dtype values of the message at msg (in_bytes bytes), with
// no host wait: the header and the section's tables are checked on the device
// (lossless_validate.h, the host parse's checks), the per-segment sizes
// scanned, the Huffman table built there, and the kernels read the payload in
// place. A refused message -- by the parse, or by a segment's invalid codes --
// leaves values untouched and, if *s.fault holds no refusal yet, is recorded
// there (kind, numbers and dtype for lossless_fault_message). Reading
// *s.fault is the caller's one wait (LosslessCudaCodec: once per collective,
// in finish()).
void lossless_decode_cuda(DType dtype, const uint8_t* msg, size_t in_bytes, int64_t n, void* values,
                          const LosslessDecodeScratch& s, cudaStream_t stream);

}  // namespace dynamiq
