// The DynamiQ codec's Codec interface over the CUDA kernels (dynamiq_kernels.h):
// the piece a GPU collective driver plugs into the executor in place of the
// CPU DynamiqCodec. Same sizes, checks, wire format and Philox streams as the
// CPU codec (it keeps one for sizes and tables), so every byte and value is
// the CPU's: tests/cpp/cuda_collective.cu runs the whole in-process
// all-reduce (every topology) with both and compares every rank bit for bit.
//
// The plan's arrays are copied to the device once per plan (its PlanKey,
// ../../plan_key.h: its identity, not its contents), one asynchronous copy
// from page-locked memory, and kept for the next calls with that plan: the
// host side of a call does not grow with the bucket. The last two plans are
// kept (two collectives taking turns on one codec upload each plan once).
// Status: compiled with nvcc in CI and run there on the CPU emulation of CUDA
// (tests/cpp/cuda_emu); never on a GPU.
#pragma once

#include <memory>
#include <vector>

#include "kernels/base/cuda/cuda_codec.h"
#include "kernels/dynamiq/cuda/dynamiq_kernels.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/plan_key.h"

namespace dynamiq {
namespace cuda {

class DynamiqCudaCodec final : public CudaCodec<DynamiqCodec> {
 public:
  explicit DynamiqCudaCodec(const DynamiqParams& p = DynamiqParams(), void* stream = nullptr,
                            bool sync_each_call = false);
  ~DynamiqCudaCodec() override;

 private:
  // One plan's arrays on the device: all four in one device allocation `d`,
  // copied from one page-locked buffer `h`, which is rewritten only once
  // that copy is done (event `copied`).
  struct PlanSlot {
    PlanKey key;  // generation 0: empty
    uint64_t last_use = 0;
    DevicePlan view;
    uint8_t* d = nullptr;
    size_t d_cap = 0;
    void* h = nullptr;
    size_t h_cap = 0;
    cudaEvent_t copied = nullptr;
    bool pending = false;  // `copied` recorded after a copy from h
  };
  static constexpr int kPlanSlots = 2;

  cudaError_t run(CodecCall& c) const override;
  // The device copy of `plan` (uploaded on the first call with it). Caller holds the lock.
  const DevicePlan& device_plan(const Plan& plan) const;
  void upload(const Plan& plan, PlanSlot& s) const;

  std::unique_ptr<DeviceTables> tables_;
  mutable PlanSlot slots_[kPlanSlots];
  mutable uint64_t clock_ = 0;
  mutable std::vector<void*> h_retired_;  // outgrown page-locked buffers (freed with the codec)
};

}  // namespace cuda
}  // namespace dynamiq
