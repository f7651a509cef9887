// The DynamiQ codec's Codec interface over the CUDA kernels (dynamiq_kernels.h):
// the piece a GPU collective driver plugs into the executor in place of the
// CPU DynamiqCodec. Same sizes, checks, wire format and Philox streams as the
// CPU codec (it keeps one for sizes and tables), so every byte and value is
// the CPU's: tests/cpp/cuda_collective.cu runs the whole in-process
// all-reduce (every topology) with both and compares every rank bit for bit.
//
// The plan's arrays are uploaded on first use and again whenever their
// contents change (one asynchronous copy from page-locked memory). Status: compiled with nvcc in CI and run there on the CPU
// emulation of CUDA (tests/cpp/cuda_emu); never on a GPU.
#pragma once

#include <memory>
#include <vector>

#include "kernels/base/cuda/cuda_codec.h"
#include "kernels/dynamiq/cuda/dynamiq_kernels.h"
#include "kernels/dynamiq/dynamiq_codec.h"

namespace dynamiq {
namespace cuda {

class DynamiqCudaCodec final : public CudaCodec<DynamiqCodec> {
 public:
  explicit DynamiqCudaCodec(const DynamiqParams& p = DynamiqParams(), void* stream = nullptr,
                            bool sync_each_call = false);
  ~DynamiqCudaCodec() override;

 private:
  cudaError_t run(CodecCall& c) const override;
  // The device copy of `plan` (uploaded when it differs from the last one). Caller holds the lock.
  DevicePlan device_plan(const Plan& plan) const;

  std::unique_ptr<DeviceTables> tables_;
  // the last uploaded plan: host copies (to detect a change) and device arrays
  mutable Plan host_plan_;
  // (all four in one device allocation, d_plan_, copied from one page-locked buffer, h_plan_)
  mutable int32_t* d_order_ = nullptr;
  mutable uint8_t* d_bits_ = nullptr;
  mutable float* d_bias_ = nullptr;
  mutable int64_t* d_wire_ = nullptr;
  mutable uint8_t* d_plan_ = nullptr;
  mutable size_t d_cap_ = 0;
  mutable void* h_plan_ = nullptr;
  mutable size_t h_cap_ = 0;
  mutable std::vector<void*> h_retired_;  // outgrown page-locked buffers (freed with the codec)
  mutable cudaEvent_t plan_done_ = nullptr;
};

}  // namespace cuda
}  // namespace dynamiq
