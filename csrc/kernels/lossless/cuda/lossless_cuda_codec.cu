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

enum Scratch : int { kExps = 0, kRaw = 1, kSum = 2, kSegStart = 3, kSizes = 4, kStart = 5 };

int64_t count_of(const Plan& plan, const Block& b) {
  const int64_t e1 = std::min(b.w1 * plan.unit, plan.numel);
  return e1 - std::min(b.w0 * plan.unit, e1);
}

}  // namespace

// What the host reads of the device's work, in one copy: the first refusal
// of the decodes since the last finish() (first: finish() reads only it), and
// the last encode's dynamic part size.
struct LosslessCudaCodec::Record {
  lossless::Fault fault;
  uint32_t dynamic;
  uint32_t pad;
};

// Host memory the codec reads from the device (page-locked, so a copy is a
// DMA the stream orders): a received header, and the record.
struct LosslessCudaCodec::HostRead {
  uint8_t header[lossless::kHeaderBytes];
  Record rec;
};

// Variable-size messages: the encode waits once, for its size (and the
// refusals so far); the decode for nothing (its refusals are read by the next
// encode or, once, in finish()).
LosslessCudaCodec::LosslessCudaCodec(LosslessOptions opt, cudaStream_t stream)
    : CudaCodec(stream, false, MessageSize::kVariable, opt), opt_(opt), id_(stream, false) {
  void* h = nullptr;
  check_cuda(cudaHostAlloc(&h, sizeof(HostRead), cudaHostAllocPortable), "page-locked allocation");
  host_read_ = static_cast<HostRead*>(h);
  d_plan_ = static_cast<LosslessDevicePlan*>(device_alloc(sizeof(LosslessDevicePlan), stream_));
  d_rec_ = static_cast<Record*>(device_alloc(sizeof(Record), stream_));
  d_table_ = static_cast<uint16_t*>(device_alloc(lossless::kDecodeTableSize * sizeof(uint16_t), stream_));
  d_state_ = static_cast<LosslessEncodeState*>(device_alloc(lossless_encode_state_bytes(), stream_));
  // before any decode or encode: no refusal yet, an empty histogram
  check_cuda(cudaMemsetAsync(d_rec_, 0, sizeof(Record), stream_), "record");
  check_cuda(cudaMemsetAsync(d_state_, 0, lossless_encode_state_bytes(), stream_), "encode state");
}

LosslessCudaCodec::~LosslessCudaCodec() {
  for (uint8_t* p : scratch_) device_free(p, stream_);
  device_free(d_plan_, stream_);
  device_free(d_rec_, stream_);
  device_free(d_table_, stream_);
  device_free(d_state_, stream_);
  cudaStreamSynchronize(stream_);  // the page-locked block may still be a queued copy's target
  cudaFreeHost(host_read_);
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
  std::lock_guard<std::mutex> lock(read_mu_);
  check_cuda(cudaMemcpyAsync(host_read_->header, static_part, lossless::kHeaderBytes, cudaMemcpyDeviceToHost, stream_),
             "header");
  check_cuda(cudaStreamSynchronize(stream_), "header");
  return host_.dynamic_bytes(host_read_->header, plan, b);
}

// Enqueued whole (lossless_encode_cuda: the format is chosen on the device),
// then one wait, for the record: this message's size, and the decodes'
// refusals so far, so that a fused hop raises before it forwards what a
// refused message decoded to.
size_t LosslessCudaCodec::encode(const void* values, DType dtype, int64_t n, uint8_t* out) const {
  const lossless::Layout L = lossless::make_layout(dtype, n);
  LosslessEncodeScratch sc;
  sc.state = d_state_;
  sc.exps = scratch(kExps, size_t(L.body));
  sc.sizes = reinterpret_cast<uint32_t*>(scratch(kSizes, size_t(L.segments + 1) * sizeof(uint32_t)));
  sc.start = reinterpret_cast<uint32_t*>(scratch(kStart, size_t(L.segments + 1) * sizeof(uint32_t)));
  sc.dynamic = &d_rec_->dynamic;
  lossless_encode_cuda(dtype, values, n, out, opt_.formats, sc, stream_);
  uint32_t dyn;
  {
    std::lock_guard<std::mutex> lock(read_mu_);
    check_cuda(cudaMemcpyAsync(&host_read_->rec, d_rec_, sizeof(Record), cudaMemcpyDeviceToHost, stream_), "size");
    check_cuda(cudaStreamSynchronize(stream_), "size");
    dyn = host_read_->rec.dynamic;
    if (pending_) raise_if_refused();
  }
  if (int64_t(dyn) > L.plain_bytes) throw Error("lossless CUDA: a section exceeded its bound (bug)");
  return size_t(L.static_bytes) + dyn;
}

// Parsed, checked and decoded on the device (lossless_decode_cuda): no copy
// to the host, no wait. A refusal leaves `values` untouched and is recorded
// in d_rec_->fault, read by the next encode's wait (a fused hop raises before it
// forwards anything) or by finish(), once per collective.
void LosslessCudaCodec::decode(const uint8_t* in, size_t in_bytes, DType dtype, int64_t n, void* values) const {
  const lossless::Layout L = lossless::make_layout(dtype, n);
  LosslessDecodeScratch sc;
  sc.plan = d_plan_;
  sc.table = d_table_;
  sc.fault = &d_rec_->fault;
  sc.exps = scratch(kExps, size_t(L.body));
  sc.seg_start = reinterpret_cast<uint32_t*>(scratch(kSegStart, size_t(L.segments + 1) * sizeof(uint32_t)));
  lossless_decode_cuda(dtype, in, in_bytes, n, values, sc, stream_);
  pending_ = true;
}

void LosslessCudaCodec::check_deferred() const {
  if (!pending_) return;
  std::lock_guard<std::mutex> lock(read_mu_);
  check_cuda(cudaMemcpyAsync(&host_read_->rec.fault, &d_rec_->fault, sizeof(lossless::Fault), cudaMemcpyDeviceToHost,
                             stream_),
             "finish");
  check_cuda(cudaStreamSynchronize(stream_), "finish");
  raise_if_refused();
}

void LosslessCudaCodec::raise_if_refused() const {
  pending_ = false;  // every decode so far is in the record just read
  const lossless::Fault f = host_read_->rec.fault;
  if (f.kind != lossless::FaultKind::kNone) {
    check_cuda(cudaMemsetAsync(&d_rec_->fault, 0, sizeof(lossless::Fault), stream_), "refusal");
    throw MalformedMessage(lossless_fault_message(f, DType(f.dtype)) + " (GPU decode)");
  }
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
    case CodecCall::kDecompressAccumulateOutput: {
      uint8_t* raw = scratch(kRaw, bytes);
      decode(c.in, c.in_bytes, plan.dtype, n, raw);
      id_.decompress_accumulate_output(raw, bytes, *c.x, plan, c.b, *c.y);
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
