// The bit-split codec's Codec interface over its CUDA kernels
// (../bitsplit_cuda.h), as DynamiqCudaCodec is for DynamiQ: sizes and checks
// from a CPU BitsplitCodec, the same bytes and values (tests/cpp/cuda_collective.cu
// runs the in-process all-reduce with both). Pointers in Local / Output / acc /
// in / out are device pointers; each call waits for its kernel when
// sync_each_call (the default). A decoder that finds a spike index out of range
// raises MalformedMessage, as the CPU codec does (it reads a device flag, so
// decoding always waits). Thread-safe. Status: compiled with nvcc in CI and run
// there on the CPU emulation of CUDA (tests/cpp/cuda_emu); never on a GPU.
#pragma once

#include <mutex>

#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/bitsplit/bitsplit_cuda.h"

namespace dynamiq {
namespace cuda {

class BitsplitCudaCodec final : public Codec {
 public:
  explicit BitsplitCudaCodec(const BitsplitParams& p, cudaStream_t stream = nullptr, bool sync_each_call = true);
  ~BitsplitCudaCodec() override;
  BitsplitCudaCodec(const BitsplitCudaCodec&) = delete;
  BitsplitCudaCodec& operator=(const BitsplitCudaCodec&) = delete;

  std::string name() const override { return "bitsplit"; }
  const BitsplitCodec& cpu() const { return cpu_; }

  size_t static_bytes(const Plan& plan, const Block& b) const override { return cpu_.static_bytes(plan, b); }
  size_t compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                  uint8_t* out) const override;
  void decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                  const Output& y) const override;
  void decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                             const Block& b, float* acc) const override;
  size_t decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, const RngCtx& rng,
                                          uint8_t* out) const override;

 private:
  BitsplitCudaBlock block(const Plan& plan, const Block& b) const;
  // Waits for the stream and raises MalformedMessage if a kernel set the flag. Caller holds mu_.
  void check_decoded(cudaError_t launch, const char* what) const;
  void finish(cudaError_t launch, const char* what) const;

  BitsplitCodec cpu_;
  cudaStream_t stream_;
  bool sync_;
  mutable std::mutex mu_;
  int* d_bad_ = nullptr;  // device flag of malformed spike indices
};

}  // namespace cuda
}  // namespace dynamiq
