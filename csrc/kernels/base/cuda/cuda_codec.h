// The base of every CUDA codec: the Codec interface (../../codec.h) over a
// codec's kernels, next to the host codec of the same format (`Host`), which
// answers everything that is not a kernel: sizes, plan and block checks,
// zero-copy views. A CUDA codec writes one function, run(), that enqueues the
// kernels of one call; the base does the rest of each of the five calls:
//   1. validates the call as the host codec does: static_bytes (plan and
//      block; the plan's own checks once per plan, not per call), and for a
//      fixed-size codec the received message's size (check_message_size);
//   2. holds the codec's lock around run() (calls are thread-safe);
//   3. raises Error "<name> cuda: <call>: <CUDA's message>" on a failed
//      launch. It does not wait for the kernels (only with sync_each_call, off
//      by default): what reads their results is ordered after them on the
//      stream (NCCL's operations, the next kernels), and whatever reads device
//      memory from the host waits itself, once, where it must (a staged or
//      in-process transport's copy to the host; the lossless codec's sizes).
// Pointers in Local / Output / acc / in / out are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <utility>

#include "kernels/base/cuda/launch.h"
#include "kernels/codec.h"

namespace dynamiq {
namespace cuda {

// One call of the Codec interface, as CudaCodec::run gets it.
struct CodecCall {
  enum Op : uint8_t {
    kCompress,
    kDecompress,
    kDecompressAccumulate,
    kDecompressAccumulateRecompress,
    kDecompressAccumulateOutput,
  };
  Op op;
  const Plan& plan;
  const Block& b;
  const Local* x = nullptr;     // every op but kDecompress
  const uint8_t* in = nullptr;  // every op but kCompress
  size_t in_bytes = 0;
  const RngCtx* rng = nullptr;  // kCompress, kDecompressAccumulateRecompress
  uint8_t* out = nullptr;       // kCompress, kDecompressAccumulateRecompress
  const Output* y = nullptr;    // kDecompress, kDecompressAccumulateOutput
  float* acc = nullptr;         // kDecompressAccumulate
  // Bytes written to `out`: set by the base to static_bytes for a fixed-size
  // codec; a variable-size one's run() sets it.
  size_t out_bytes = 0;

  const char* what() const {
    switch (op) {
      case kCompress: return "compress";
      case kDecompress: return "decompress";
      case kDecompressAccumulate: return "decompress_accumulate";
      case kDecompressAccumulateRecompress: return "decompress_accumulate_recompress";
      case kDecompressAccumulateOutput: return "decompress_accumulate_output";
    }
    return "?";
  }
};

// Whether a codec's messages have a dynamic part (Codec::max_dynamic_bytes).
enum class MessageSize : uint8_t { kFixed, kVariable };

template <class Host>
class CudaCodec : public Codec {
 public:
  CudaCodec(const CudaCodec&) = delete;
  CudaCodec& operator=(const CudaCodec&) = delete;

  std::string name() const override { return host_.name(); }
  // The host codec of the same format (sizes, tables, parameters).
  const Host& cpu() const { return host_; }

  size_t static_bytes(const Plan& plan, const Block& b) const override { return host_.static_bytes(plan, b); }
  size_t max_dynamic_bytes(const Plan& plan, const Block& b) const override {
    return host_.max_dynamic_bytes(plan, b);
  }
  // Views are pointer arithmetic on the caller's memory: the host codec's answer holds.
  const uint8_t* wire_view(const Local& x, const Plan& plan, const Block& b) const override {
    return host_.wire_view(x, plan, b);
  }
  uint8_t* output_view(const Output& y, const Plan& plan, const Block& b) const override {
    return host_.output_view(y, plan, b);
  }

  size_t compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                  uint8_t* out) const final {
    CodecCall c{CodecCall::kCompress, plan, b};
    c.x = &x;
    c.rng = &rng;
    c.out = out;
    return call(c);
  }
  void decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                  const Output& y) const final {
    CodecCall c{CodecCall::kDecompress, plan, b};
    c.in = in;
    c.in_bytes = in_bytes;
    c.y = &y;
    call(c);
  }
  void decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                             const Block& b, float* acc) const final {
    CodecCall c{CodecCall::kDecompressAccumulate, plan, b};
    c.in = in;
    c.in_bytes = in_bytes;
    c.x = &x;
    c.acc = acc;
    call(c);
  }
  void decompress_accumulate_output(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                                    const Block& b, const Output& y) const final {
    CodecCall c{CodecCall::kDecompressAccumulateOutput, plan, b};
    c.in = in;
    c.in_bytes = in_bytes;
    c.x = &x;
    c.y = &y;
    call(c);
  }
  void finish() const final {
    std::lock_guard<std::mutex> lock(mu_);
    check_deferred();
  }
  size_t decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, const RngCtx& rng,
                                          uint8_t* out) const final {
    CodecCall c{CodecCall::kDecompressAccumulateRecompress, plan, b};
    c.in = in;
    c.in_bytes = in_bytes;
    c.x = &x;
    c.rng = &rng;
    c.out = out;
    return call(c);
  }

 protected:
  template <class... HostArgs>
  CudaCodec(cudaStream_t stream, bool sync_each_call, MessageSize size, HostArgs&&... host_args)
      : host_(std::forward<HostArgs>(host_args)...), stream_(stream), sync_(sync_each_call), size_(size) {}

  // Enqueues the call's kernels on stream_ (the base holds mu_); returns the
  // launch status. May throw Error / MalformedMessage itself.
  virtual cudaError_t run(CodecCall& c) const = 0;
  // finish() (../../codec.h) under the codec's lock: raise what decodes deferred.
  virtual void check_deferred() const {}

  // Raises Error "<name> cuda: <what>: <CUDA's message>" unless e is cudaSuccess
  // (the strings are built only then: this runs on every call).
  void check_cuda(cudaError_t e, const char* what) const {
    if (e != cudaSuccess) check(e, (name() + " cuda").c_str(), what);
  }
  void check_cuda(cudaError_t e, const std::string& what) const { check_cuda(e, what.c_str()); }

  const Host host_;
  const cudaStream_t stream_;

 private:
  // Host work independent of the bucket and the block: the host codec checks
  // a plan once, the first time it sees it (then each call's block: O(1)),
  // and a device codec keeps what it uploads per plan (../../plan_key.h).
  size_t call(CodecCall& c) const {
    const size_t bytes = host_.static_bytes(c.plan, c.b);  // validates the plan and block
    if (size_ == MessageSize::kFixed) {
      if (c.in && c.in_bytes != bytes) check_message_size(c.in_bytes, bytes, name().c_str());
      c.out_bytes = bytes;
    }
    std::lock_guard<std::mutex> lock(mu_);
    cudaError_t e = run(c);
    check_cuda(e, c.what());
    if (sync_) check_cuda(cudaStreamSynchronize(stream_), c.what());
    return c.out_bytes;
  }

  const bool sync_;
  const MessageSize size_;
  mutable std::mutex mu_;
};

}  // namespace cuda
}  // namespace dynamiq
