// The lossless codec's Codec interface over its CUDA kernels (../lossless_cuda.h),
// as DynamiqCudaCodec is for DynamiQ: the same two-part messages, bytes and
// values as the CPU LosslessCodec (tests/cpp/cuda_collective.cu runs the
// in-process all-reduce with both). An encode is enqueued whole -- split,
// histogram, the format choice (on the device), section and header -- and
// then waits once, for its size (4 bytes, read with the decodes' refusals);
// the receiver copies a received static part's 16-byte header to the host
// for the announced size of its dynamic part (where the transport needs it).
// A received message is parsed, checked and decoded on the device with no
// wait (lossless_decode_cuda); a refusal raises MalformedMessage from the
// next encode (so a fused hop never forwards what a refused message decoded
// to) or from finish(), once per collective, as the bitsplit codec's. Host
// reads go through page-locked memory. Sums and the mean's division are the
// identity codec's (IdentityCudaCodec), as on the CPU. Status: compiled with
// nvcc in CI and run there on the CPU emulation of CUDA (tests/cpp/cuda_emu);
// never on a GPU.
#pragma once

#include <mutex>

#include "kernels/base/cuda/cuda_codec.h"
#include "kernels/identity/cuda/identity_cuda_codec.h"
#include "kernels/lossless/lossless_codec.h"
#include "kernels/lossless/lossless_cuda.h"

namespace dynamiq {
namespace cuda {

class LosslessCudaCodec final : public CudaCodec<LosslessCodec> {
 public:
  explicit LosslessCudaCodec(LosslessOptions opt = {}, cudaStream_t stream = nullptr);
  ~LosslessCudaCodec() override;

  size_t dynamic_bytes(const uint8_t* static_part, const Plan& plan, const Block& b) const override;

 private:
  cudaError_t run(CodecCall& c) const override;
  // Device scratch, grown on demand. Caller holds the lock.
  uint8_t* scratch(int k, size_t bytes) const;
  // out <- the message of n dtype values at `values` (device). Caller holds the lock.
  size_t encode(const void* values, DType dtype, int64_t n, uint8_t* out) const;
  // values <- decode of a received message. Caller holds the lock.
  void decode(const uint8_t* in, size_t in_bytes, DType dtype, int64_t n, void* values) const;

  void check_deferred() const override;
  // After host_read_->rec.fault was read (read_mu_ held): raise the recorded refusal, if any, and clear it.
  void raise_if_refused() const;

  struct Record;
  struct HostRead;
  LosslessOptions opt_;
  IdentityCudaCodec id_;
  // exps, raw, sum, seg_start (of the device parse), the encode's segment sizes and starts
  mutable uint8_t* scratch_[6] = {};
  mutable size_t scratch_bytes_[6] = {};
  // The device parse's plan and Huffman table; the record (the first refusal
  // since finish(), the last encode's size); the encode's state.
  LosslessDevicePlan* d_plan_ = nullptr;
  Record* d_rec_ = nullptr;
  uint16_t* d_table_ = nullptr;
  LosslessEncodeState* d_state_ = nullptr;
  HostRead* host_read_ = nullptr;  // page-locked
  mutable std::mutex read_mu_;     // host_read_ (dynamic_bytes runs outside the codec's lock)
  mutable bool pending_ = false;   // a decode since the last finish()
};

}  // namespace cuda
}  // namespace dynamiq
