// DynamiqCudaCodec: see dynamiq_cuda_codec.h.
#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"

#include <cuda_runtime.h>

#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace cuda {
namespace {

// On the codec's stream, waited for: the kernels run on that stream (which may
// be a non-blocking one, unordered with the legacy default stream's cudaMemcpy)
// and `host` may be freed once this returns.
template <typename T>
void upload(T*& dev, const std::vector<T>& host, cudaStream_t stream) {
  device_free(dev, stream);
  dev = nullptr;
  if (host.empty()) return;
  dev = static_cast<T*>(device_alloc(host.size() * sizeof(T), stream));
  check(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
        "dynamiq cuda", "plan upload");
  check(cudaStreamSynchronize(stream), "dynamiq cuda", "plan upload");
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
    : CudaCodec(static_cast<cudaStream_t>(stream), sync_each_call, MessageSize::kFixed, p) {
  const std::string why = unsupported(host_.params());
  if (!why.empty()) throw Error("dynamiq (CUDA): " + why);
  tables_ = std::make_unique<DeviceTables>(host_.tables(), stream_);
}

DynamiqCudaCodec::~DynamiqCudaCodec() {
  device_free(d_order_, stream_);
  device_free(d_bits_, stream_);
  device_free(d_bias_, stream_);
  device_free(d_wire_, stream_);
}

DevicePlan DynamiqCudaCodec::device_plan(const Plan& plan) const {
  const bool same = host_plan_.numel == plan.numel && host_plan_.dtype == plan.dtype &&
                    host_plan_.unit == plan.unit && host_plan_.order == plan.order && host_plan_.bits == plan.bits &&
                    host_plan_.bias == plan.bias && host_plan_.wire_offset == plan.wire_offset && d_wire_ != nullptr;
  if (!same) {
    upload(d_order_, plan.order, stream_);
    upload(d_bits_, plan.bits, stream_);
    upload(d_bias_, plan.bias, stream_);
    upload(d_wire_, plan.wire_offset, stream_);
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
    case CodecCall::kDecompress: {
      DeviceOutput dy;
      dy.bucket = c.y->bucket;
      dy.bias_scale = c.y->bias_scale;
      dy.divisor = c.y->divisor;
      err = cuda::decompress(p, tables_->view(), dp, c.in, w0, w1, dy, stream_);
      break;
    }
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
