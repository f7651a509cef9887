// CUDA launchers of the lossless codec (cuda/lossless_encode_kernels.cu,
// cuda/lossless_plan_kernel.cu, cuda/lossless_decode_kernels.cu): a warp per
// 1024-exponent segment for the ZipCCL and Huffman sections (warp prefix sums
// place each lane's escapes or bits), a thread per 8-value group with 16-byte
// accesses for the split and the merge. The format is chosen on the device by
// the host's rules (lossless_plan_encode, redone in plan_kernel), so a GPU
// message is byte-identical to the CPU one and the encode needs no host wait
// until its size is read; a received message is validated on the device by
// the host parse's own checks (lossless_validate.h).
//
// All pointers are device pointers. Functions only enqueue on `stream`: no
// host wait, no copy to the host. CUDA failures raise dynamiq::Error; the
// decode records a malformed message on the device (lossless_decode_cuda).
//
// Status: compiled with nvcc in CI; bit-equality with the CPU path is asserted
// by tests/cpp/cuda_lossless*.cu, run in CI on the CPU emulation of CUDA
// (tests/cpp/cuda_emu); never run on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/lossless/lossless_codec.h"
#include "kernels/lossless/lossless_validate.h"

namespace dynamiq {

// The GPU encode's device state (cuda/lossless_device.h): histogram, format
// choice and tables, carried from kernel to kernel. Allocate
// lossless_encode_state_bytes(), zero it once, then reuse it in stream order
// (every encode leaves it ready for the next).
struct LosslessEncodeState;
size_t lossless_encode_state_bytes();

// Device memory of lossless_encode_cuda, owned by the caller and reused from
// call to call (in stream order).
struct LosslessEncodeScratch {
  LosslessEncodeState* state = nullptr;  // see above
  uint8_t* exps = nullptr;               // Layout::body bytes, 16-byte aligned
  uint32_t* sizes = nullptr;             // S (Layout::segments): each segment's escapes / stream bytes
  uint32_t* start = nullptr;             // S + 1: their exclusive prefix sums and total
  uint32_t* dynamic = nullptr;           // one: receives the message's dynamic_bytes
};

// Enqueues the encode of the n dtype values at `values` into msg (room for
// static + plain exponent bytes), as lossless_encode with opt.formats =
// formats: split and histogram, the format choice, the per-segment sizes and
// their scan, the section, the header. Nothing waits: *s.dynamic receives the
// dynamic part's size (0xffffffff: a section exceeded the plan's bound, a
// bug), which the caller reads in its one wait per message.
void lossless_encode_cuda(DType dtype, const void* values, int64_t n, uint8_t* msg, uint32_t formats,
                          const LosslessEncodeScratch& s, cudaStream_t stream);

// The format choice alone (one block; lossless_encode_cuda's second launch):
// reads and clears st->hist, writes the choice and its tables to *st and the
// section's table to msg. For tests of the choice against lossless_plan_encode.
void lossless_plan_cuda(DType dtype, int64_t n, uint32_t formats, LosslessEncodeState* st, uint8_t* msg,
                        cudaStream_t stream);

// What the device parse of a received message found (parse_kernel): the
// section decoders and the merge read it on the device.
struct LosslessDevicePlan {
  lossless::Fault fault{};  // the parse's refusal (kind kNone: parsed)
  int32_t codes_bad = 0;   // set by the section decoders: a segment's codes are invalid
  uint8_t format = 0;      // lossless::ExpFormat
  uint8_t constant = 0;
  uint8_t zip_table[8] = {};
  int64_t planes_offset = 0, payload_offset = 0, payload_bytes = 0;
  uint64_t const_exps = 0;  // const: the exponent in each of 8 bytes (the merge's exponents of every group)
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
