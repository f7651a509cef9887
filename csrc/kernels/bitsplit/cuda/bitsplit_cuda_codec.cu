// BitsplitCudaCodec: see bitsplit_cuda_codec.h.
#include "kernels/bitsplit/cuda/bitsplit_cuda_codec.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"

namespace dynamiq {
namespace cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) { check(e, "bitsplit cuda", what); }

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
    : cpu_(p), stream_(stream), sync_(sync_each_call) {
  d_bad_ = static_cast<int*>(device_alloc(sizeof(int), stream_));
  check_cuda(cudaMemsetAsync(d_bad_, 0, sizeof(int), stream_), "flag");  // on the kernels' stream
  check_cuda(cudaStreamSynchronize(stream_), "flag");
}

BitsplitCudaCodec::~BitsplitCudaCodec() { device_free(d_bad_, stream_); }

BitsplitCudaBlock BitsplitCudaCodec::block(const Plan& plan, const Block& b) const {
  BitsplitCudaBlock cb;
  cb.f = cpu_.format(plan.dtype);
  cb.e0 = std::min(b.w0 * plan.unit, plan.numel);
  cb.e1 = std::min(b.w1 * plan.unit, plan.numel);
  return cb;
}

void BitsplitCudaCodec::finish(cudaError_t launch, const char* what) const {
  check_cuda(launch, what);
  if (sync_) check_cuda(cudaStreamSynchronize(stream_), what);
}

void BitsplitCudaCodec::check_decoded(cudaError_t launch, const char* what) const {
  check_cuda(launch, what);
  int bad = 0;
  check_cuda(cudaMemcpyAsync(&bad, d_bad_, sizeof(int), cudaMemcpyDeviceToHost, stream_), what);
  check_cuda(cudaStreamSynchronize(stream_), what);
  if (bad) {
    check_cuda(cudaMemsetAsync(d_bad_, 0, sizeof(int), stream_), what);
    throw MalformedMessage("bitsplit: a spike index is out of range (GPU decode)");
  }
}

size_t BitsplitCudaCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                                   uint8_t* out) const {
  const size_t bytes = cpu_.static_bytes(plan, b);
  check_aligned(out, "compress");
  const BitsplitCudaBlock cb = block(plan, b);
  bool is_f32 = false;
  const void* xp = local_at(x, plan, b, cb.e0, is_f32);
  std::lock_guard<std::mutex> lock(mu_);
  finish(bitsplit_compress_cuda(cb, xp, is_f32, rng.key, uint32_t(rng.rank), rng.stochastic, out, stream_),
         "compress");
  return bytes;
}

void BitsplitCudaCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                                   const Output& y) const {
  check_message_size(in_bytes, cpu_.static_bytes(plan, b), "bitsplit");
  check_aligned(in, "decompress");
  const BitsplitCudaBlock cb = block(plan, b);
  void* yp = static_cast<uint8_t*>(y.bucket) + cb.e0 * dtype_size(plan.dtype);
  std::lock_guard<std::mutex> lock(mu_);
  check_decoded(bitsplit_decompress_cuda(cb, in, yp, y.divisor, d_bad_, stream_), "decompress");
}

void BitsplitCudaCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                              const Plan& plan, const Block& b, float* acc) const {
  check_message_size(in_bytes, cpu_.static_bytes(plan, b), "bitsplit");
  check_aligned(in, "decompress_accumulate");
  const BitsplitCudaBlock cb = block(plan, b);
  bool is_f32 = false;
  const void* xp = local_at(x, plan, b, cb.e0, is_f32);
  std::lock_guard<std::mutex> lock(mu_);
  check_decoded(bitsplit_decompress_accumulate_cuda(cb, in, xp, is_f32, acc, d_bad_, stream_),
                "decompress_accumulate");
}

size_t BitsplitCudaCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                                           const Plan& plan, const Block& b, const RngCtx& rng,
                                                           uint8_t* out) const {
  const size_t bytes = cpu_.static_bytes(plan, b);
  check_message_size(in_bytes, bytes, "bitsplit");
  check_aligned(in, "decompress_accumulate_recompress");
  check_aligned(out, "decompress_accumulate_recompress");
  const BitsplitCudaBlock cb = block(plan, b);
  bool is_f32 = false;
  const void* xp = local_at(x, plan, b, cb.e0, is_f32);
  std::lock_guard<std::mutex> lock(mu_);
  check_decoded(bitsplit_decompress_accumulate_recompress_cuda(cb, in, xp, is_f32, rng.key, uint32_t(rng.rank),
                                                               rng.stochastic, out, d_bad_, stream_),
                "decompress_accumulate_recompress");
  return bytes;
}

}  // namespace cuda
}  // namespace dynamiq
