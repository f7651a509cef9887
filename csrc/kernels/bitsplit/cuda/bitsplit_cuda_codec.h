// The bit-split codec's Codec interface over its CUDA kernels
// (../bitsplit_cuda.h), as DynamiqCudaCodec is for DynamiQ: sizes and checks
// from a CPU BitsplitCodec, the same bytes and values (tests/cpp/cuda_collective.cu
// runs the in-process all-reduce with both). A decoder that finds a spike
// index out of range sets a device flag; finish() (once per collective, the
// executor's) reads it and raises MalformedMessage, so decoding never waits. Status: compiled with nvcc in CI
// and run there on the CPU emulation of CUDA (tests/cpp/cuda_emu); never on a GPU.
#pragma once

#include "kernels/base/cuda/cuda_codec.h"
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/bitsplit/bitsplit_cuda.h"

namespace dynamiq {
namespace cuda {

class BitsplitCudaCodec final : public CudaCodec<BitsplitCodec> {
 public:
  explicit BitsplitCudaCodec(const BitsplitParams& p, cudaStream_t stream = nullptr, bool sync_each_call = false);
  ~BitsplitCudaCodec() override;

 private:
  cudaError_t run(CodecCall& c) const override;
  // A decoding launch's status (its flag is read by check_deferred).
  cudaError_t checked_decode(cudaError_t launch, const char* what) const;
  // Raises MalformedMessage (and clears the flag) if a decode set it.
  void check_deferred() const override;

  int* d_bad_ = nullptr;  // device flag of malformed spike indices
};

}  // namespace cuda
}  // namespace dynamiq
