// The DynamiQ codec's Codec interface over the CUDA kernels (dynamiq_kernels.h):
// the piece a GPU collective driver plugs into the executor in place of the
// CPU DynamiqCodec. Same sizes, checks, wire format and Philox streams as the
// CPU codec (it keeps one for sizes and tables), so every byte and value is
// the CPU's: tests/cpp/cuda_collective.cu runs the whole in-process
// all-reduce (every topology) with both and compares every rank bit for bit.
//
// Pointers in Local / Output / acc / in / out are device pointers. Each call
// enqueues its kernel on the codec's stream and, with sync_each_call (the
// default: an executor that posts host sends right after), waits for it.
// The plan's arrays are uploaded on first use and again whenever their
// contents change. Calls are thread-safe. Status: compiled with nvcc in CI and
// run there on the CPU emulation of CUDA (tests/cpp/cuda_emu); never on a GPU.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kernels/codec.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/dynamiq/cuda/dynamiq_kernels.h"

namespace dynamiq {
namespace cuda {

class DynamiqCudaCodec final : public Codec {
 public:
  explicit DynamiqCudaCodec(const DynamiqParams& p = DynamiqParams(), void* stream = nullptr,
                            bool sync_each_call = true);
  ~DynamiqCudaCodec() override;
  DynamiqCudaCodec(const DynamiqCudaCodec&) = delete;
  DynamiqCudaCodec& operator=(const DynamiqCudaCodec&) = delete;

  std::string name() const override { return "dynamiq"; }
  const DynamiqCodec& cpu() const { return cpu_; }

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
  // The device copy of `plan` (uploaded when it differs from the last one). Caller holds mu_.
  DevicePlan device_plan(const Plan& plan) const;
  void finish(int err, const char* what) const;

  DynamiqCodec cpu_;
  void* stream_;
  bool sync_;
  mutable std::mutex mu_;
  mutable std::unique_ptr<DeviceTables> tables_;
  // the last uploaded plan: host copies (to detect a change) and device arrays
  mutable Plan host_;
  mutable int32_t* d_order_ = nullptr;
  mutable uint8_t* d_bits_ = nullptr;
  mutable float* d_bias_ = nullptr;
  mutable int64_t* d_wire_ = nullptr;
};

}  // namespace cuda
}  // namespace dynamiq
