// DynamiqCudaCodec: see dynamiq_cuda_codec.h.
#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace cuda {
namespace {

// Where each array starts in the packed plan (8-byte aligned parts).
size_t align8(size_t n) { return (n + 7) / 8 * 8; }

DeviceLocal device_local(const Local& x) {
  DeviceLocal d;
  d.bucket = x.bucket;
  d.acc = x.acc;
  d.acc_w0 = x.acc_w0;
  return d;
}

DeviceOutput device_output(const Output& y) {
  DeviceOutput d;
  d.bucket = y.bucket;
  d.bias_scale = y.bias_scale;
  d.divisor = y.divisor;
  return d;
}

}  // namespace

DynamiqCudaCodec::DynamiqCudaCodec(const DynamiqParams& p, void* stream, bool sync_each_call)
    : CudaCodec(static_cast<cudaStream_t>(stream), sync_each_call, MessageSize::kFixed, p) {
  const std::string why = unsupported(host_.params());
  if (!why.empty()) throw Error("dynamiq (CUDA): " + why);
  tables_ = std::make_unique<DeviceTables>(host_.tables(), stream_);
}

DynamiqCudaCodec::~DynamiqCudaCodec() {
  device_free(d_plan_, stream_);
  if (h_plan_) h_retired_.push_back(h_plan_);
  for (void* p : h_retired_) cudaFreeHost(p);  // (waits for the device, so for the last upload too)
  if (plan_done_) cudaEventDestroy(plan_done_);
}

DevicePlan DynamiqCudaCodec::device_plan(const Plan& plan) const {
  const bool same = host_plan_.numel == plan.numel && host_plan_.dtype == plan.dtype &&
                    host_plan_.unit == plan.unit && host_plan_.order == plan.order && host_plan_.bits == plan.bits &&
                    host_plan_.bias == plan.bias && host_plan_.wire_offset == plan.wire_offset && d_wire_ != nullptr;
  if (!same) {
    // One copy of the four arrays, packed, from page-locked memory (truly
    // asynchronous), on the kernels' stream: no host wait. The page-locked
    // buffer is rewritten only once its last copy is done (plan_done_),
    // which it is by the time a later collective brings a new plan.
    const size_t o_wire = 0, o_bias = o_wire + align8(plan.wire_offset.size() * sizeof(int64_t));
    const size_t o_order = o_bias + align8(plan.bias.size() * sizeof(float));
    const size_t o_bits = o_order + align8(plan.order.size() * sizeof(int32_t));
    const size_t total = std::max<size_t>(o_bits + plan.bits.size(), 8);
    const char* who = "dynamiq cuda";
    if (!plan_done_) check(cudaEventCreateWithFlags(&plan_done_, cudaEventDisableTiming), who, "plan upload");
    if (h_plan_) check(cudaEventSynchronize(plan_done_), who, "plan upload");  // done already, in practice
    if (h_cap_ < total) {
      // the old buffer is freed with the codec: cudaFreeHost would wait for the whole device
      if (h_plan_) h_retired_.push_back(h_plan_);
      h_plan_ = nullptr;
      size_t cap = 4096;
      while (cap < total) cap *= 2;
      check(cudaHostAlloc(&h_plan_, cap, cudaHostAllocPortable), who, "plan upload");
      h_cap_ = cap;
    }
    if (d_cap_ < total) {
      device_free(d_plan_, stream_);
      d_plan_ = nullptr;
      d_cap_ = 0;
      d_plan_ = static_cast<uint8_t*>(device_alloc(total, stream_));
      d_cap_ = total;
    }
    auto* h = static_cast<uint8_t*>(h_plan_);
    auto put = [&](size_t off, const void* src, size_t bytes) {
      if (bytes) std::memcpy(h + off, src, bytes);
    };
    put(o_wire, plan.wire_offset.data(), plan.wire_offset.size() * sizeof(int64_t));
    put(o_bias, plan.bias.data(), plan.bias.size() * sizeof(float));
    put(o_order, plan.order.data(), plan.order.size() * sizeof(int32_t));
    put(o_bits, plan.bits.data(), plan.bits.size());
    check(cudaMemcpyAsync(d_plan_, h_plan_, total, cudaMemcpyHostToDevice, stream_), who, "plan upload");
    check(cudaEventRecord(plan_done_, stream_), who, "plan upload");
    d_wire_ = plan.wire_offset.empty() ? nullptr : reinterpret_cast<int64_t*>(d_plan_ + o_wire);
    d_bias_ = plan.bias.empty() ? nullptr : reinterpret_cast<float*>(d_plan_ + o_bias);
    d_order_ = plan.order.empty() ? nullptr : reinterpret_cast<int32_t*>(d_plan_ + o_order);
    d_bits_ = plan.bits.empty() ? nullptr : d_plan_ + o_bits;
    host_plan_ = plan;
  }
  DevicePlan d;
  d.dtype = plan.dtype;
  d.numel = plan.numel;
  d.unit = plan.unit;
  d.num_units = plan.num_units;
  d.order = d_order_;
  d.bits = d_bits_;
  d.bias = d_bias_;
  d.wire_offset = d_wire_;
  return d;
}

cudaError_t DynamiqCudaCodec::run(CodecCall& c) const {
  const DynamiqParams& p = host_.params();
  const DevicePlan dp = device_plan(c.plan);
  const int64_t w0 = c.b.w0, w1 = c.b.w1;
  int err = 0;
  switch (c.op) {
    case CodecCall::kCompress:
      err = cuda::compress(p, tables_->view(), dp, device_local(*c.x), w0, w1, tables_->rounding(*c.rng), c.out,
                           stream_);
      break;
    case CodecCall::kDecompress:
      err = cuda::decompress(p, tables_->view(), dp, c.in, w0, w1, device_output(*c.y), stream_);
      break;
    case CodecCall::kDecompressAccumulateOutput:
      err = cuda::decompress_accumulate_output(p, tables_->view(), dp, c.in, device_local(*c.x), w0, w1,
                                               device_output(*c.y), stream_);
      break;
    case CodecCall::kDecompressAccumulate:
      err = cuda::decompress_accumulate(p, tables_->view(), dp, c.in, device_local(*c.x), w0, w1, c.acc, stream_);
      break;
    case CodecCall::kDecompressAccumulateRecompress:
      err = cuda::decompress_accumulate_recompress(p, tables_->view(), dp, c.in, device_local(*c.x), w0, w1,
                                                   tables_->rounding(*c.rng), c.out, stream_);
      break;
  }
  return static_cast<cudaError_t>(err);
}

// Mode dynamiq's CUDA codec and statistics pass (registry_cuda.cu): the
// statistics of dynamiq_local_stats (dynamiq_stats.h) on device data, on the
// device's stream and waited for, written to host memory.
DeviceCodecFactory dynamiq_cuda_codec_factory() {
  DeviceCodecFactory f;
  f.make_codec = [](const Codec& host, const Device& d) -> std::unique_ptr<Codec> {
    return std::make_unique<DynamiqCudaCodec>(host_codec_as<DynamiqCodec>(host).params(), d.stream());
  };
  f.local_pass = [](const Codec& host, const Device& d, const void* data, DType dtype, int64_t numel,
                    float* host_stats) {
    if (numel <= 0) return false;
    const int32_t S = host_codec_as<DynamiqCodec>(host).params().fmt.S;
    const auto st = static_cast<cudaStream_t>(d.stream());
    const int64_t units = ceil_div<int64_t>(numel, S);
    DeviceArray<float> stats_d(size_t(2 * units), st);
    DeviceArray<uint32_t> flag(1, st);
    const char* who = "dynamiq cuda";
    check(cudaMemsetAsync(flag.p, 0, sizeof(uint32_t), st), who, "statistics");
    check(cudaError_t(stats(data, dtype, numel, S, stats_d.p, flag.p, st)), who, "statistics");
    uint32_t bad = 0;
    check(cudaMemcpyAsync(host_stats, stats_d.p, size_t(2 * units) * sizeof(float), cudaMemcpyDeviceToHost, st),
          who, "statistics");
    check(cudaMemcpyAsync(&bad, flag.p, sizeof(bad), cudaMemcpyDeviceToHost, st), who, "statistics");
    check(cudaStreamSynchronize(st), who, "statistics");
    return bad != 0;
  };
  return f;
}

}  // namespace cuda
}  // namespace dynamiq
