// DynamiqCudaCodec: see dynamiq_cuda_codec.h.
#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"

#include <cuda_runtime.h>

#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"

namespace dynamiq {
namespace cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) { check(e, "dynamiq cuda", what); }

// On the codec's stream, waited for: the kernels run on that stream (which may
// be a non-blocking one, unordered with the legacy default stream's cudaMemcpy)
// and `host` may be freed once this returns.
template <typename T>
void upload(T*& dev, const std::vector<T>& host, cudaStream_t stream) {
  device_free(dev, stream);
  dev = nullptr;
  if (host.empty()) return;
  dev = static_cast<T*>(device_alloc(host.size() * sizeof(T), stream));
  check_cuda(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
             "plan upload");
  check_cuda(cudaStreamSynchronize(stream), "plan upload");
}

DeviceLocal device_local(const Local& x) {
  DeviceLocal d;
  d.bucket = x.bucket;
  d.acc = x.acc;
  d.acc_w0 = x.acc_w0;
  return d;
}

}  // namespace

DynamiqCudaCodec::DynamiqCudaCodec(const DynamiqParams& p, void* stream, bool sync_each_call)
    : cpu_(p), stream_(stream), sync_(sync_each_call) {
  const std::string why = unsupported(cpu_.params());
  if (!why.empty()) throw Error("dynamiq (CUDA): " + why);
  tables_ = std::make_unique<DeviceTables>(cpu_.tables(), stream_);
}

DynamiqCudaCodec::~DynamiqCudaCodec() {
  const auto st = static_cast<cudaStream_t>(stream_);
  device_free(d_order_, st);
  device_free(d_bits_, st);
  device_free(d_bias_, st);
  device_free(d_wire_, st);
}

DevicePlan DynamiqCudaCodec::device_plan(const Plan& plan) const {
  const bool same = host_.numel == plan.numel && host_.dtype == plan.dtype && host_.unit == plan.unit &&
                    host_.order == plan.order && host_.bits == plan.bits && host_.bias == plan.bias &&
                    host_.wire_offset == plan.wire_offset && d_wire_ != nullptr;
  if (!same) {
    const auto st = static_cast<cudaStream_t>(stream_);
    upload(d_order_, plan.order, st);
    upload(d_bits_, plan.bits, st);
    upload(d_bias_, plan.bias, st);
    upload(d_wire_, plan.wire_offset, st);
    host_ = plan;
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

void DynamiqCudaCodec::finish(int err, const char* what) const {
  check_cuda(static_cast<cudaError_t>(err), what);
  if (sync_) check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), what);
}

size_t DynamiqCudaCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                                  uint8_t* out) const {
  const size_t bytes = cpu_.static_bytes(plan, b);
  std::lock_guard<std::mutex> lock(mu_);
  const DevicePlan dp = device_plan(plan);
  finish(cuda::compress(cpu_.params(), tables_->view(), dp, device_local(x), b.w0, b.w1, tables_->rounding(rng), out,
                        stream_),
         "compress");
  return bytes;
}

void DynamiqCudaCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                                  const Output& y) const {
  check_message_size(in_bytes, cpu_.static_bytes(plan, b), "dynamiq");
  std::lock_guard<std::mutex> lock(mu_);
  const DevicePlan dp = device_plan(plan);
  DeviceOutput dy;
  dy.bucket = y.bucket;
  dy.bias_scale = y.bias_scale;
  dy.divisor = y.divisor;
  finish(cuda::decompress(cpu_.params(), tables_->view(), dp, in, b.w0, b.w1, dy, stream_), "decompress");
}

void DynamiqCudaCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                             const Plan& plan, const Block& b, float* acc) const {
  check_message_size(in_bytes, cpu_.static_bytes(plan, b), "dynamiq");
  std::lock_guard<std::mutex> lock(mu_);
  const DevicePlan dp = device_plan(plan);
  finish(cuda::decompress_accumulate(cpu_.params(), tables_->view(), dp, in, device_local(x), b.w0, b.w1, acc,
                                     stream_),
         "decompress_accumulate");
}

size_t DynamiqCudaCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                                          const Plan& plan, const Block& b, const RngCtx& rng,
                                                          uint8_t* out) const {
  const size_t bytes = cpu_.static_bytes(plan, b);
  check_message_size(in_bytes, bytes, "dynamiq");
  std::lock_guard<std::mutex> lock(mu_);
  const DevicePlan dp = device_plan(plan);
  finish(cuda::decompress_accumulate_recompress(cpu_.params(), tables_->view(), dp, in, device_local(x), b.w0,
                                                b.w1, tables_->rounding(rng), out, stream_),
         "decompress_accumulate_recompress");
  return bytes;
}

}  // namespace cuda
}  // namespace dynamiq
