// LosslessCudaCodec: see lossless_cuda_codec.h.
#include "kernels/lossless/cuda/lossless_cuda_codec.h"

#include <algorithm>
#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"

namespace dynamiq {
namespace cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) { check(e, "lossless cuda", what); }

enum Scratch : int { kExps = 0, kRaw = 1, kSum = 2, kHist = 3 };

int64_t count_of(const Plan& plan, const Block& b) {
  const int64_t e1 = std::min(b.w1 * plan.unit, plan.numel);
  return e1 - std::min(b.w0 * plan.unit, e1);
}

}  // namespace

LosslessCudaCodec::LosslessCudaCodec(LosslessOptions opt, cudaStream_t stream)
    : cpu_(opt), opt_(opt), id_(stream, true), stream_(stream) {}

LosslessCudaCodec::~LosslessCudaCodec() {
  for (uint8_t* p : scratch_) device_free(p, stream_);
}

uint8_t* LosslessCudaCodec::scratch(int k, size_t bytes) const {
  if (bytes > scratch_bytes_[k] || !scratch_[k]) {
    device_free(scratch_[k], stream_);
    scratch_[k] = nullptr;
    scratch_bytes_[k] = 0;
    const size_t cap = std::max<size_t>(bytes, 256);
    scratch_[k] = static_cast<uint8_t*>(device_alloc(cap, stream_));
    scratch_bytes_[k] = cap;
  }
  return scratch_[k];
}

size_t LosslessCudaCodec::dynamic_bytes(const uint8_t* static_part, const Plan& plan, const Block& b) const {
  uint8_t header[lossless::kHeaderBytes];
  check_cuda(cudaMemcpyAsync(header, static_part, sizeof(header), cudaMemcpyDeviceToHost, stream_), "header");
  check_cuda(cudaStreamSynchronize(stream_), "header");
  return cpu_.dynamic_bytes(header, plan, b);
}

size_t LosslessCudaCodec::encode(const void* values, DType dtype, int64_t n, uint8_t* out) const {
  const lossless::Layout L = lossless::make_layout(dtype, n);
  uint8_t* exps = scratch(kExps, size_t(L.body));
  auto* hist = reinterpret_cast<unsigned long long*>(scratch(kHist, 256 * sizeof(unsigned long long)));
  lossless_split_cuda(dtype, values, n, out, exps, stream_);
  lossless_histogram_cuda(exps, L.body, hist, stream_);
  unsigned long long h[256];
  check_cuda(cudaMemcpyAsync(h, hist, sizeof(h), cudaMemcpyDeviceToHost, stream_), "histogram");
  check_cuda(cudaStreamSynchronize(stream_), "histogram");
  uint64_t freq[256];
  for (int i = 0; i < 256; ++i) freq[i] = h[i];
  LosslessEncodePlan plan;
  lossless_plan_encode(dtype, n, freq, opt_, plan);
  const size_t dyn = lossless_encode_section_cuda(dtype, plan, exps, out, stream_);
  uint8_t header[lossless::kHeaderBytes];
  lossless_write_header(header, dtype, n, plan.format, uint32_t(dyn));
  check_cuda(cudaMemcpyAsync(out, header, sizeof(header), cudaMemcpyHostToDevice, stream_), "header");
  check_cuda(cudaStreamSynchronize(stream_), "header");
  return size_t(L.static_bytes) + dyn;
}

void LosslessCudaCodec::decode(const uint8_t* in, size_t in_bytes, DType dtype, int64_t n, void* values) const {
  std::vector<uint8_t> host(in_bytes);
  check_cuda(cudaMemcpyAsync(host.data(), in, in_bytes, cudaMemcpyDeviceToHost, stream_), "message");
  check_cuda(cudaStreamSynchronize(stream_), "message");
  LosslessDecodePlan P;
  lossless_parse(host.data(), in_bytes, dtype, n, P);  // validates; MalformedMessage
  uint8_t* exps = scratch(kExps, size_t(P.layout.body));
  lossless_decode_section_cuda(dtype, P, in, exps, stream_);
  lossless_merge_cuda(dtype, in, exps, n, values, stream_);
  check_cuda(cudaStreamSynchronize(stream_), "merge");
}

size_t LosslessCudaCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                                   uint8_t* out) const {
  cpu_.static_bytes(plan, b);  // validates the plan and block
  const int64_t n = count_of(plan, b), e0 = std::min(b.w0 * plan.unit, plan.numel);
  const size_t es = size_t(dtype_size(plan.dtype));
  std::lock_guard<std::mutex> lock(mu_);
  const void* values;
  if (x.acc) {
    // the identity codec's rounding of the float accumulator to the bucket dtype
    uint8_t* raw = scratch(kRaw, size_t(n) * es);
    id_.compress(x, plan, b, rng, raw);
    values = raw;
  } else {
    values = static_cast<const uint8_t*>(x.bucket) + size_t(e0) * es;
  }
  return encode(values, plan.dtype, n, out);
}

void LosslessCudaCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                                   const Output& y) const {
  cpu_.static_bytes(plan, b);
  const int64_t n = count_of(plan, b), e0 = std::min(b.w0 * plan.unit, plan.numel);
  const size_t es = size_t(dtype_size(plan.dtype));
  uint8_t* dst = static_cast<uint8_t*>(y.bucket) + size_t(e0) * es;
  std::lock_guard<std::mutex> lock(mu_);
  decode(in, in_bytes, plan.dtype, n, dst);
  if (y.divisor != 1.0f) id_.decompress(dst, size_t(n) * es, plan, b, y);  // in place, as the CPU codec
}

void LosslessCudaCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                              const Plan& plan, const Block& b, float* acc) const {
  cpu_.static_bytes(plan, b);
  const int64_t n = count_of(plan, b);
  const size_t bytes = size_t(n) * size_t(dtype_size(plan.dtype));
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t* raw = scratch(kRaw, bytes);
  decode(in, in_bytes, plan.dtype, n, raw);
  id_.decompress_accumulate(raw, bytes, x, plan, b, acc);
}

size_t LosslessCudaCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                                           const Plan& plan, const Block& b, const RngCtx& rng,
                                                           uint8_t* out) const {
  cpu_.static_bytes(plan, b);
  const int64_t n = count_of(plan, b);
  const size_t bytes = size_t(n) * size_t(dtype_size(plan.dtype));
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t* raw = scratch(kRaw, bytes);
  decode(in, in_bytes, plan.dtype, n, raw);
  uint8_t* sum = scratch(kSum, bytes);
  id_.decompress_accumulate_recompress(raw, bytes, x, plan, b, rng, sum);
  return encode(sum, plan.dtype, n, out);
}

}  // namespace cuda
}  // namespace dynamiq
