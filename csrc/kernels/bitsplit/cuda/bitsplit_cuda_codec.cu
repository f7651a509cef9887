// BitsplitCudaCodec: see bitsplit_cuda_codec.h.
#include "kernels/bitsplit/cuda/bitsplit_cuda_codec.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace cuda {
namespace {

// The block's local values: the bucket at element e0, or the wire-order
// float accumulator at the block's first unit.
const void* local_at(const Local& x, const Plan& plan, const Block& b, int64_t e0, bool& is_f32) {
  is_f32 = x.acc != nullptr;
  if (is_f32) return x.acc + (b.w0 - x.acc_w0) * plan.unit;
  return static_cast<const uint8_t*>(x.bucket) + e0 * dtype_size(plan.dtype);
}

// The device code reads and writes messages as 32- and 16-bit words (the
// host code copies bytes), so a message must start 4-byte aligned on the GPU;
// the executor's buffers (device_alloc: 256-byte aligned, pool) always do.
void check_aligned(const void* p, const char* what) {
  DQ_CHECK(reinterpret_cast<uintptr_t>(p) % 4 == 0,
           std::string("bitsplit (CUDA): ") + what + ": message buffer not 4-byte aligned");
}

}  // namespace

BitsplitCudaCodec::BitsplitCudaCodec(const BitsplitParams& p, cudaStream_t stream, bool sync_each_call)
    : CudaCodec(stream, sync_each_call, MessageSize::kFixed, p) {
  d_bad_ = static_cast<int*>(device_alloc(sizeof(int), stream_));
  check_cuda(cudaMemsetAsync(d_bad_, 0, sizeof(int), stream_), "flag");  // on the kernels' stream, before them
}

BitsplitCudaCodec::~BitsplitCudaCodec() { device_free(d_bad_, stream_); }

cudaError_t BitsplitCudaCodec::checked_decode(cudaError_t launch, const char* what) const {
  check_cuda(launch, what);  // the flag stays on the device until check_deferred
  return cudaSuccess;
}

void BitsplitCudaCodec::check_deferred() const {
  int bad = 0;
  check_cuda(cudaMemcpyAsync(&bad, d_bad_, sizeof(int), cudaMemcpyDeviceToHost, stream_), "finish");
  check_cuda(cudaStreamSynchronize(stream_), "finish");
  if (bad) {
    check_cuda(cudaMemsetAsync(d_bad_, 0, sizeof(int), stream_), "finish");
    throw MalformedMessage("bitsplit: a spike index is out of range (GPU decode)");
  }
}

cudaError_t BitsplitCudaCodec::run(CodecCall& c) const {
  const Plan& plan = c.plan;
  if (c.in) check_aligned(c.in, c.what());
  if (c.out) check_aligned(c.out, c.what());
  BitsplitCudaBlock cb;
  cb.f = host_.format(plan.dtype);
  cb.e0 = std::min(c.b.w0 * plan.unit, plan.numel);
  cb.e1 = std::min(c.b.w1 * plan.unit, plan.numel);
  if (c.op == CodecCall::kDecompress) {
    void* yp = static_cast<uint8_t*>(c.y->bucket) + cb.e0 * dtype_size(plan.dtype);
    return checked_decode(bitsplit_decompress_cuda(cb, c.in, yp, c.y->divisor, d_bad_, stream_), c.what());
  }
  bool is_f32 = false;
  const void* xp = local_at(*c.x, plan, c.b, cb.e0, is_f32);
  switch (c.op) {
    case CodecCall::kCompress:
      return bitsplit_compress_cuda(cb, xp, is_f32, c.rng->key, uint32_t(c.rng->rank), c.rng->stochastic, c.out,
                                    stream_);
    case CodecCall::kDecompressAccumulate:
      return checked_decode(bitsplit_decompress_accumulate_cuda(cb, c.in, xp, is_f32, c.acc, d_bad_, stream_),
                            c.what());
    case CodecCall::kDecompressAccumulateOutput: {
      void* yp = static_cast<uint8_t*>(c.y->bucket) + cb.e0 * dtype_size(plan.dtype);
      return checked_decode(
          bitsplit_decompress_accumulate_output_cuda(cb, c.in, xp, is_f32, yp, c.y->divisor, d_bad_, stream_),
          c.what());
    }
    default:  // kDecompressAccumulateRecompress
      return checked_decode(bitsplit_decompress_accumulate_recompress_cuda(cb, c.in, xp, is_f32, c.rng->key,
                                                                           uint32_t(c.rng->rank), c.rng->stochastic,
                                                                           c.out, d_bad_, stream_),
                            c.what());
  }
}

// Mode bitsplit's CUDA codec (registry_cuda.cu).
DeviceCodecFactory bitsplit_cuda_codec_factory() {
  DeviceCodecFactory f;
  f.make_codec = [](const Codec& host, const Device& d) -> std::unique_ptr<Codec> {
    return std::make_unique<BitsplitCudaCodec>(host_codec_as<BitsplitCodec>(host).params(),
                                               static_cast<cudaStream_t>(d.stream()));
  };
  return f;
}

}  // namespace cuda
}  // namespace dynamiq
