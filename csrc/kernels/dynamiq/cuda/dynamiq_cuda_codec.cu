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
  for (PlanSlot& s : slots_) {
    device_free(s.d, stream_);
    if (s.h) h_retired_.push_back(s.h);
  }
  for (void* p : h_retired_) cudaFreeHost(p);  // (waits for the device, so for the last uploads too)
  for (PlanSlot& s : slots_)
    if (s.copied) cudaEventDestroy(s.copied);
}

const DevicePlan& DynamiqCudaCodec::device_plan(const Plan& plan) const {
  const PlanKey key = plan_key(plan);
  PlanSlot* s = nullptr;
  for (PlanSlot& x : slots_)
    if (x.key == key) s = &x;
  if (!s) {
    s = &slots_[0];  // the least recently used (an empty one first)
    for (PlanSlot& x : slots_)
      if (x.last_use < s->last_use) s = &x;
    s->key = PlanKey();
    upload(plan, *s);
    s->key = key;
  }
  s->last_use = ++clock_;
  return s->view;
}

// One copy of the four arrays, packed, from page-locked memory (truly
// asynchronous), on the kernels' stream: ordered after the kernels that read
// the slot's previous plan, before those that read this one. No host wait but
// for the slot's previous copy, done long before in practice (it is at least
// a plan old).
void DynamiqCudaCodec::upload(const Plan& plan, PlanSlot& s) const {
  const size_t o_wire = 0, o_bias = o_wire + align8(plan.wire_offset.size() * sizeof(int64_t));
  const size_t o_order = o_bias + align8(plan.bias.size() * sizeof(float));
  const size_t o_bits = o_order + align8(plan.order.size() * sizeof(int32_t));
  const size_t total = std::max<size_t>(o_bits + plan.bits.size(), 8);
  const char* who = "dynamiq cuda";
  if (!s.copied) check(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), who, "plan upload");
  if (s.pending) check(cudaEventSynchronize(s.copied), who, "plan upload");
  s.pending = false;
  if (s.h_cap < total) {
    // the old buffer is freed with the codec: cudaFreeHost would wait for the whole device
    if (s.h) h_retired_.push_back(s.h);
    s.h = nullptr;
    s.h_cap = 0;
    size_t cap = 4096;
    while (cap < total) cap *= 2;
    check(cudaHostAlloc(&s.h, cap, cudaHostAllocPortable), who, "plan upload");
    s.h_cap = cap;
  }
  if (s.d_cap < total) {
    device_free(s.d, stream_);  // (stream-ordered: after the kernels that read it)
    s.d = nullptr;
    s.d_cap = 0;
    s.d = static_cast<uint8_t*>(device_alloc(total, stream_));
    s.d_cap = total;
  }
  auto* h = static_cast<uint8_t*>(s.h);
  auto put = [&](size_t off, const void* src, size_t bytes) {
    if (bytes) std::memcpy(h + off, src, bytes);
  };
  put(o_wire, plan.wire_offset.data(), plan.wire_offset.size() * sizeof(int64_t));
  put(o_bias, plan.bias.data(), plan.bias.size() * sizeof(float));
  put(o_order, plan.order.data(), plan.order.size() * sizeof(int32_t));
  put(o_bits, plan.bits.data(), plan.bits.size());
  check(cudaMemcpyAsync(s.d, s.h, total, cudaMemcpyHostToDevice, stream_), who, "plan upload");
  check(cudaEventRecord(s.copied, stream_), who, "plan upload");
  s.pending = true;
  DevicePlan& d = s.view;
  d.dtype = plan.dtype;
  d.numel = plan.numel;
  d.unit = plan.unit;
  d.num_units = plan.num_units;
  d.wire_offset = plan.wire_offset.empty() ? nullptr : reinterpret_cast<int64_t*>(s.d + o_wire);
  d.bias = plan.bias.empty() ? nullptr : reinterpret_cast<float*>(s.d + o_bias);
  d.order = plan.order.empty() ? nullptr : reinterpret_cast<int32_t*>(s.d + o_order);
  d.bits = plan.bits.empty() ? nullptr : s.d + o_bits;
}

cudaError_t DynamiqCudaCodec::run(CodecCall& c) const {
  const DynamiqParams& p = host_.params();
  const DevicePlan& dp = device_plan(c.plan);
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
