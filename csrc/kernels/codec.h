// The codec interface: the only thing the collective driver knows about
// compression. A bucket is cut into fixed-size *units* (a codec's natural
// granule: a DynamiQ super-group, a bit-split group run, a raw slab). The plan
// puts units in *wire order* (for DynamiQ: reordered by width and balanced
// across chunks) and cuts the wire order into chunks, one per owner rank. The
// driver cuts chunks into *blocks* (pipelining sub-chunks); every message on
// the wire carries one block, and a codec encodes or decodes one block at a
// time.
//
// A block message is a *static part*, whose size every rank knows from the
// plan, followed by an optional *dynamic part* (lossless escapes), whose size
// the receiver reads from the validated static part. Fixed-size codecs have
// no dynamic part. The executor sends both parts as one transport message
// where a receive may be posted for the largest size (Gloo), else as two.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/common.h"
#include "kernels/base/philox.h"

namespace dynamiq {

// A plan's identity for the caches of work done once per plan (a codec's
// checks, a device codec's copy of the arrays: plan_key.h). Process-wide
// unique: every Plan made, copied or moved gets a new one, so a copy that is
// then changed, or another plan made where a freed one was, never shares the
// identity of a plan a codec has seen.
class PlanGeneration {
 public:
  PlanGeneration() : v_(next()) {}
  PlanGeneration(const PlanGeneration&) : v_(next()) {}
  PlanGeneration(PlanGeneration&& o) noexcept : v_(next()) { o.v_ = next(); }
  PlanGeneration& operator=(const PlanGeneration&) {
    v_ = next();
    return *this;
  }
  PlanGeneration& operator=(PlanGeneration&& o) noexcept {
    v_ = next();
    o.v_ = next();
    return *this;
  }
  uint64_t value() const { return v_; }
  void renew() { v_ = next(); }

 private:
  static uint64_t next() {
    static std::atomic<uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  uint64_t v_;
};

// How a bucket is laid out for one collective. Built identically on every rank
// from the same inputs (the all-reduced statistics and the config).
//
// Fixed once a codec has seen it: a codec checks a plan once, when it first
// sees it, and a device codec copies its arrays to the device once, both
// cached under the plan's identity (plan_key.h). To change a plan a codec has
// seen, make a new one (a copy is one: it gets a new generation), or call
// touch() after changing it in place. An element written in place without
// touch() goes unseen: the codecs keep the old checks and device copy.
struct Plan {
  DType dtype = DType::kF32;
  int64_t numel = 0;
  int32_t unit = 256;     // elements per unit (the last unit may be partial)
  int64_t num_units = 0;  // ceil(numel / unit)

  // order[w] = source unit index at wire position w. Empty means identity.
  std::vector<int32_t> order;
  // Per *source* unit: bits per element chosen by the allocator (DynamiQ); empty otherwise.
  std::vector<uint8_t> bits;
  // Per *source* unit: value subtracted before compression and added back after
  // (DynamiQ's super-group mean); empty means 0.
  std::vector<float> bias;
  // wire_offset[w] = fixed wire bytes of wire positions [0, w) (size num_units + 1).
  // For variable-size codecs it holds an estimate used only for balancing.
  std::vector<int64_t> wire_offset;
  // chunk_begin[c] = first wire position of chunk c (size num_chunks + 1).
  std::vector<int64_t> chunk_begin;
  // Mode bounded: the absolute error bound e of one compression, resolved by
  // the scheme from the config (and, for a relative bound, the all-reduced
  // statistics), so equal on every rank. 0 for the other modes.
  float error_bound = 0.0f;

  int64_t src_unit(int64_t w) const { return order.empty() ? w : order[size_t(w)]; }
  int64_t unit_elem_begin(int64_t src) const { return src * unit; }
  int64_t unit_elem_count(int64_t src) const {
    int64_t b = src * unit;
    int64_t e = b + unit < numel ? b + unit : numel;
    return e - b;
  }
  float unit_bias(int64_t src) const { return bias.empty() ? 0.0f : bias[size_t(src)]; }
  int num_chunks() const { return int(chunk_begin.size()) - 1; }

  // This plan's identity (see above). touch(): its contents changed, give it a new one.
  uint64_t generation() const { return gen_.value(); }
  void touch() { gen_.renew(); }

 private:
  PlanGeneration gen_;
};

// A run of wire positions [w0, w1) that travels as one message.
struct Block {
  int64_t w0 = 0, w1 = 0;
  int64_t units() const { return w1 - w0; }
  bool empty() const { return w1 <= w0; }
};

// Where a rank's current partial value for the units of a block lives.
//  - in the caller's bucket (first touch): element e of source unit s is
//    bucket[s*unit + i] minus plan.bias[s]; elements past numel read as 0;
//  - or in a float accumulator laid out in wire order, `plan.unit` floats per
//    wire position, acc[(w - acc_w0) * unit + i] (bias already removed).
struct Local {
  const void* bucket = nullptr;
  const float* acc = nullptr;
  int64_t acc_w0 = 0;
};

// Where a decompressed final result goes: bucket[s*unit + i] =
//   dtype_round((value + bias_scale * plan.bias[s]) * scale)
// (for DynamiQ bias_scale = world size, adding back the n summed means; scale
// is 1 for sum and 1/n applied as a division for mean).
struct Output {
  void* bucket = nullptr;
  float bias_scale = 0.0f;
  float divisor = 1.0f;
};

// Randomness context of one compression call.
struct RngCtx {
  RngKey key{0, 0};
  int rank = 0;        // this rank in the group
  int world = 1;       // group size: the n of correlated rounding
  bool correlated = true;
  bool stochastic = true;
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual std::string name() const = 0;

  // Size of the static part of block [w0, w1).
  virtual size_t static_bytes(const Plan& plan, const Block& b) const = 0;
  // Upper bound of the dynamic part (0 for fixed-size codecs).
  virtual size_t max_dynamic_bytes(const Plan& plan, const Block& b) const {
    (void)plan, (void)b;
    return 0;
  }
  // Size of the dynamic part announced by a received static part. Must validate
  // the static part's header and never return more than max_dynamic_bytes.
  virtual size_t dynamic_bytes(const uint8_t* static_part, const Plan& plan, const Block& b) const {
    (void)static_part, (void)plan, (void)b;
    return 0;
  }
  size_t max_message_bytes(const Plan& plan, const Block& b) const {
    return static_bytes(plan, b) + max_dynamic_bytes(plan, b);
  }

  // Zero-copy leaf: if the wire bytes of compress(x) are already in memory
  // (the identity codec on an untouched bucket), a pointer to them, else null.
  // The executor then sends from that memory and waits for the send before
  // anything writes to the block's part of the bucket.
  virtual const uint8_t* wire_view(const Local& x, const Plan& plan, const Block& b) const {
    (void)x, (void)plan, (void)b;
    return nullptr;
  }
  // Zero-copy output: if the block's final bytes can be kept in the bucket as
  // its output values (identity codec: final bytes are values of the bucket's
  // dtype), the block's place in the bucket, else null. The executor then has
  // the sink write its final bytes there and turn them into output values in
  // place (decompress with the view as input: a division for mean, nothing for
  // sum), sends the block's final bytes from there, and receives final bytes
  // straight into the bucket, unchanged. So with a view, the final bytes on the
  // wire are output values (for mean: divided once, by the sink), and every
  // rank ends with the sink's bits. Saves keeping a copy of the rank's share
  // of the bucket for the all-gather.
  virtual uint8_t* output_view(const Output& y, const Plan& plan, const Block& b) const {
    (void)y, (void)plan, (void)b;
    return nullptr;
  }
  // Leaf: out <- compress(local). Returns the bytes written (static + dynamic).
  virtual size_t compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                          uint8_t* out) const = 0;
  // All-gather receiver and sink: final values -> Output.
  virtual void decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                          const Output& y) const = 0;
  // acc <- x + decompress(in). `acc` is laid out in wire order starting at b.w0;
  // x may alias acc.
  virtual void decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                     const Plan& plan, const Block& b, float* acc) const = 0;
  // Fused middle hop: out <- compress(x + decompress(in)), one pass, no
  // full-precision temporary beyond one unit. Returns the bytes written.
  virtual size_t decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes,
                                                  const Local& x, const Plan& plan,
                                                  const Block& b, const RngCtx& rng,
                                                  uint8_t* out) const = 0;
  // Reduce-scatter sink of a lossy codec: y <- x + decompress(in), the sum
  // itself written as output values (as decompress writes them: bias added
  // back, divided, rounded to the dtype), not compressed first: no rank
  // receives a reduce-scatter's final bytes. The default (host memory):
  // decompress_accumulate into a float buffer of the block, then store_unit
  // (base/unit_io.h) per unit; a codec may fuse the two. Device codecs
  // implement it on the device (cuda/cuda_codec.h).
  virtual void decompress_accumulate_output(const uint8_t* in, size_t in_bytes, const Local& x,
                                            const Plan& plan, const Block& b, const Output& y) const;
  // Raises MalformedMessage if a decode since the last finish() found a
  // malformed message that it could not report at once (a device codec whose
  // kernels set a flag: reading it after each decode would make the host wait
  // for every kernel). The executor calls it once at the end of each
  // execute() (also after a failure, to clear it). Default: nothing deferred.
  virtual void finish() const {}
};

// Where a codec's buffers live: the executor allocates its message buffers and
// accumulator here, and an in-process transport copies through to_host /
// from_host. host_memory() for the CPU codecs; a device's memory for the CUDA
// ones (cuda/cuda_memory.h).
class Memory {
 public:
  virtual ~Memory() = default;
  virtual std::string name() const = 0;
  // At least `bytes` bytes (also for 0), not zeroed. Throws Error on failure.
  virtual void* allocate(size_t bytes) const = 0;
  virtual void release(void* p) const = 0;
  // Hands memory released earlier back to the system where the allocator keeps
  // it for reuse (a device's memory pool); called when a buffer pool shrinks.
  virtual void trim() const {}
  // Which of this Memory's address spaces the calling thread allocates in now
  // (the current device for a GPU; 0 for host memory): buffer pools are kept
  // per (Memory, domain), so a buffer never moves to another device.
  virtual int domain() const { return 0; }
  virtual void to_host(void* host_dst, const void* src, size_t bytes) const = 0;
  virtual void from_host(void* dst, const void* host_src, size_t bytes) const = 0;
};
const Memory& host_memory();

// ---- helpers shared by codecs -------------------------------------------------

// Throws MalformedMessage unless a received message has exactly the expected size.
inline void check_message_size(size_t got, size_t expected, const char* codec) {
  if (got != expected)
    throw MalformedMessage(std::string(codec) + ": block of " + std::to_string(got) +
                           " bytes, expected " + std::to_string(expected));
}

}  // namespace dynamiq
