// CUDA launchers of the DynamiQ kernels (torch-free). Thin loops over the
// __host__ __device__ math of dynamiq_math.h, a thread per 8 contiguous values
// (an octet) held in registers, so the fused kernel reads the received bytes
// and the local values once and writes the new bytes once (design:
// ../README.md, "CUDA kernels"). Same wire format and same Philox streams as
// the CPU codec (DynamiqCodec): the outputs are bit-identical
// (tests/cpp/cuda_dynamiq_kernels.cu).
// Status: compiled with nvcc in CI and run there on the CPU emulation of CUDA
// (tests/cpp/cuda_emu); never run on a GPU.
//
// All pointers are device pointers unless noted. Launchers are asynchronous
// on `stream` and return the launch's cudaError_t (as int, 0 = success); they
// never abort.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "kernels/dynamiq/dynamiq_codec.h"

namespace dynamiq {
namespace cuda {

// The plan as device arrays (copies of Plan's vectors; order/bias may be null).
struct DevicePlan {
  DType dtype = DType::kF32;
  int64_t numel = 0;
  int32_t unit = 256;
  int64_t num_units = 0;
  const int32_t* order = nullptr;       // wire position -> source SG (null: identity)
  const uint8_t* bits = nullptr;        // per source SG
  const float* bias = nullptr;          // per source SG (null: none)
  const int64_t* wire_offset = nullptr; // num_units + 1
};

// Local data of a block: the bucket (dtype of the plan, source order) or a
// float accumulator in wire order starting at wire position acc_w0.
struct DeviceLocal {
  const void* bucket = nullptr;
  const float* acc = nullptr;
  int64_t acc_w0 = 0;
};

struct DeviceOutput {
  void* bucket = nullptr;
  float bias_scale = 0.0f;
  float divisor = 1.0f;
};

// Device copies of a codec's tables and of permutation-table columns.
class DeviceTables {
 public:
  // Uploads tables.image() (throws Error on failure) on `stream`, the stream
  // the kernels using them run on, and waits for that stream only: a
  // device-wide synchronisation would also wait for other streams' work (the
  // user's, NCCL's), which may itself be waiting for this collective.
  explicit DeviceTables(const DynamiqTables& tables, void* stream = nullptr);
  ~DeviceTables();
  DeviceTables(const DeviceTables&) = delete;
  DeviceTables& operator=(const DeviceTables&) = delete;
  const DqTables& view() const { return view_; }
  // The rounding context for a call, with the permutation column on the device.
  DqRounding rounding(const RngCtx& rng);

 private:
  void* stream_ = nullptr;
  uint8_t* image_ = nullptr;
  DqTables view_;
  std::map<std::pair<int, int>, int32_t*> columns_;
};

// Empty when the kernels can run a super-group of these parameters, else why
// not: outside the warp path's formats a block holds a super-group in shared
// memory (5 bytes per element and 8 per group), and a kernel gets 48 KiB of it
// without an opt-in.
std::string unsupported(const DynamiqParams& prm);

int stats(const void* data, DType dtype, int64_t numel, int32_t S, float* out,
          uint32_t* nonfinite /* device word, OR-ed with 1 on inf/nan */, void* stream);

int compress(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const DeviceLocal& x,
             int64_t w0, int64_t w1, const DqRounding& rd, uint8_t* out, void* stream);

int decompress(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const uint8_t* in,
               int64_t w0, int64_t w1, const DeviceOutput& y, void* stream);

int decompress_accumulate(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p,
                          const uint8_t* in, const DeviceLocal& x, int64_t w0, int64_t w1,
                          float* acc, void* stream);

int decompress_accumulate_recompress(const DynamiqParams& prm, const DqTables& tb,
                                     const DevicePlan& p, const uint8_t* in, const DeviceLocal& x,
                                     int64_t w0, int64_t w1, const DqRounding& rd, uint8_t* out,
                                     void* stream);

// The reduce-scatter sink (Codec::decompress_accumulate_output): y <- x + decompress(in).
int decompress_accumulate_output(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p,
                                 const uint8_t* in, const DeviceLocal& x, int64_t w0, int64_t w1,
                                 const DeviceOutput& y, void* stream);

}  // namespace cuda
}  // namespace dynamiq
