// LosslessCudaCodec: see lossless_cuda_codec.h.
#include "kernels/lossless/cuda/lossless_cuda_codec.h"

#include <algorithm>
#include <string>

#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace cuda {
namespace {

enum Scratch : int { kExps = 0, kRaw = 1, kSum = 2, kHist = 3, kTables = 4 };

int64_t count_of(const Plan& plan, const Block& b) {
  const int64_t e1 = std::min(b.w1 * plan.unit, plan.numel);
  return e1 - std::min(b.w0 * plan.unit, e1);
}

}  // namespace

// Variable-size messages, each call waits for its work itself: no wait in the base.
LosslessCudaCodec::LosslessCudaCodec(LosslessOptions opt, cudaStream_t stream)
    : CudaCodec(stream, false, MessageSize::kVariable, opt), opt_(opt), id_(stream, false) {}

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
  return host_.dynamic_bytes(header, plan, b);
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
  // (from pageable memory: read at the call; ordered before what reads the message)
  check_cuda(cudaMemcpyAsync(out, header, sizeof(header), cudaMemcpyHostToDevice, stream_), "header");
  return size_t(L.static_bytes) + dyn;
}

// What the host reads of a received message: its 16-byte header and the first
// min(dynamic_bytes, lossless_parse_prefix_bytes) bytes of its dynamic part
// (at most 385 bytes of table + 2 per 1024-value segment: the const exponent,
// the ZipCCL table or the Huffman symbols and code lengths, and the
// per-segment escape counts or stream sizes) -- what lossless_parse checks,
// what sizes the launches and what builds the tables. Both are gathered on the
// device into one scratch buffer and read with one D2H copy and one wait. The
// SM planes, the zip code planes and escapes and the Huffman streams are read
// in place by the kernels, which flag invalid codes; lossless_decode_section_cuda
// reads that flag (4 bytes, the second and last wait). E.g. a 1 MiB bf16
// message (n = 512K, S = 512): at most 16 + 385 + 1024 = 1425 bytes.
void LosslessCudaCodec::decode(const uint8_t* in, size_t in_bytes, DType dtype, int64_t n, void* values) const {
  const lossless::Layout L = lossless::make_layout(dtype, n);
  if (in_bytes < size_t(L.static_bytes))  // before any copy: even the header may be missing
    throw MalformedMessage("lossless: truncated message: " + std::to_string(in_bytes) +
                           " bytes, the static part alone is " + std::to_string(L.static_bytes));
  const size_t sec_bytes = std::min(in_bytes - size_t(L.static_bytes), lossless_parse_prefix_bytes(dtype, n));
  const size_t hb = size_t(lossless::kHeaderBytes);
  uint8_t* gather = scratch(kTables, hb + sec_bytes);
  check_cuda(cudaMemcpyAsync(gather, in, hb, cudaMemcpyDeviceToDevice, stream_), "header");
  if (sec_bytes)
    check_cuda(cudaMemcpyAsync(gather + hb, in + L.static_bytes, sec_bytes, cudaMemcpyDeviceToDevice, stream_),
               "section tables");
  std::vector<uint8_t> host(hb + sec_bytes);
  check_cuda(cudaMemcpyAsync(host.data(), gather, host.size(), cudaMemcpyDeviceToHost, stream_), "header and tables");
  check_cuda(cudaStreamSynchronize(stream_), "header and tables");
  LosslessDecodePlan P;
  // validates; MalformedMessage
  lossless_parse_parts(host.data(), host.data() + hb, sec_bytes, in_bytes, dtype, n, P);
  uint8_t* exps = scratch(kExps, size_t(P.layout.body));
  lossless_decode_section_cuda(dtype, P, in, exps, stream_);  // waits; MalformedMessage on bad codes
  lossless_merge_cuda(dtype, in, exps, n, values, stream_);  // not waited for: stream order
}

cudaError_t LosslessCudaCodec::run(CodecCall& c) const {
  const Plan& plan = c.plan;
  const int64_t n = count_of(plan, c.b), e0 = std::min(c.b.w0 * plan.unit, plan.numel);
  const size_t es = size_t(dtype_size(plan.dtype));
  const size_t bytes = size_t(n) * es;
  switch (c.op) {
    case CodecCall::kCompress: {
      const void* values;
      if (c.x->acc) {
        // the identity codec's rounding of the float accumulator to the bucket dtype
        uint8_t* raw = scratch(kRaw, bytes);
        id_.compress(*c.x, plan, c.b, *c.rng, raw);
        values = raw;
      } else {
        values = static_cast<const uint8_t*>(c.x->bucket) + size_t(e0) * es;
      }
      c.out_bytes = encode(values, plan.dtype, n, c.out);
      break;
    }
    case CodecCall::kDecompress: {
      uint8_t* dst = static_cast<uint8_t*>(c.y->bucket) + size_t(e0) * es;
      decode(c.in, c.in_bytes, plan.dtype, n, dst);
      if (c.y->divisor != 1.0f) id_.decompress(dst, bytes, plan, c.b, *c.y);  // in place, as the CPU codec
      break;
    }
    case CodecCall::kDecompressAccumulate: {
      uint8_t* raw = scratch(kRaw, bytes);
      decode(c.in, c.in_bytes, plan.dtype, n, raw);
      id_.decompress_accumulate(raw, bytes, *c.x, plan, c.b, c.acc);
      break;
    }
    case CodecCall::kDecompressAccumulateRecompress: {
      uint8_t* raw = scratch(kRaw, bytes);
      decode(c.in, c.in_bytes, plan.dtype, n, raw);
      uint8_t* sum = scratch(kSum, bytes);
      id_.decompress_accumulate_recompress(raw, bytes, *c.x, plan, c.b, *c.rng, sum);
      c.out_bytes = encode(sum, plan.dtype, n, c.out);
      break;
    }
  }
  return cudaSuccess;
}

// Mode lossless's CUDA codec (registry_cuda.cu).
DeviceCodecFactory lossless_cuda_codec_factory() {
  DeviceCodecFactory f;
  f.make_codec = [](const Codec& host, const Device& d) -> std::unique_ptr<Codec> {
    return std::make_unique<LosslessCudaCodec>(host_codec_as<LosslessCodec>(host).options(),
                                               static_cast<cudaStream_t>(d.stream()));
  };
  return f;
}

}  // namespace cuda
}  // namespace dynamiq
