// The identity codec (mode none, the exact path, the statistics all-reduce)
// over CUDA kernels: the same bytes and values as the CPU IdentityCodec (float
// sums and divisions are single IEEE operations on both), including its
// zero-copy views (CudaCodec forwards them to the host codec). Status:
// compiled with nvcc in CI and run there on the CPU emulation of CUDA
// (tests/cpp/cuda_emu, tests/cpp/cuda_collective.cu); never on a GPU.
#pragma once

#include <cuda_runtime.h>

#include "kernels/base/cuda/cuda_codec.h"
#include "kernels/identity/identity_codec.h"

namespace dynamiq {
namespace cuda {

class IdentityCudaCodec final : public CudaCodec<IdentityCodec> {
 public:
  explicit IdentityCudaCodec(cudaStream_t stream = nullptr, bool sync_each_call = false)
      : CudaCodec(stream, sync_each_call, MessageSize::kFixed) {}

 private:
  cudaError_t run(CodecCall& c) const override;
};

}  // namespace cuda
}  // namespace dynamiq
