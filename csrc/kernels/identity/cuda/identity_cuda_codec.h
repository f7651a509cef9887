// The identity codec (mode none, the exact path, the statistics all-reduce)
// over CUDA kernels: the same bytes and values as the CPU IdentityCodec (float
// sums and divisions are single IEEE operations on both), including its
// zero-copy views. Pointers are device pointers; each call waits for its work
// when sync_each_call (the default). Thread-safe (no state). Status: compiled
// with nvcc in CI and run there on the CPU emulation of CUDA
// (tests/cpp/cuda_emu, tests/cpp/cuda_collective.cu); never on a GPU.
#pragma once

#include <cuda_runtime.h>

#include "kernels/identity/identity_codec.h"

namespace dynamiq {
namespace cuda {

class IdentityCudaCodec final : public Codec {
 public:
  explicit IdentityCudaCodec(cudaStream_t stream = nullptr, bool sync_each_call = true)
      : stream_(stream), sync_(sync_each_call) {}

  std::string name() const override { return "identity"; }
  size_t static_bytes(const Plan& plan, const Block& b) const override { return cpu_.static_bytes(plan, b); }
  const uint8_t* wire_view(const Local& x, const Plan& plan, const Block& b) const override {
    return cpu_.wire_view(x, plan, b);  // pointer arithmetic only
  }
  uint8_t* output_view(const Output& y, const Plan& plan, const Block& b) const override {
    return cpu_.output_view(y, plan, b);
  }
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
  void finish(cudaError_t e, const char* what) const;
  IdentityCodec cpu_;  // sizes, checks and views
  cudaStream_t stream_;
  bool sync_;
};

}  // namespace cuda
}  // namespace dynamiq
