// An O(1) key of a plan's contents, for the work a codec does once per plan
// instead of once per call: the DynamiQ codec's checks of the plan's arrays
// (DynamiqCodec::check_plan), the CUDA DynamiQ codec's copy of them to the
// device. Comparing the arrays themselves, element by element, made every
// call's host time grow with the bucket (issue 41: 0.15 ms per call at 64 MiB).
//
// The key is the plan's generation (codec.h: new for every Plan made, copied or
// moved, and after touch()) and, as a guard against a change made against
// Plan's rule (changed after a codec saw it, without touch()), what an O(1)
// look can see of one: the scalar fields, and each array's address and length
// (a resize, a reallocation, an assignment of another length). An element
// written in place without touch() is not seen.
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>

#include "kernels/codec.h"

namespace dynamiq {

struct PlanKey {
  uint64_t generation = 0;  // 0: no plan
  DType dtype = DType::kF32;
  int32_t unit = 0;
  int64_t numel = 0, num_units = 0;
  uint32_t error_bound_bits = 0;
  const void* data[5] = {};
  size_t size[5] = {};

  bool operator==(const PlanKey& o) const {
    if (generation != o.generation || dtype != o.dtype || unit != o.unit || numel != o.numel ||
        num_units != o.num_units || error_bound_bits != o.error_bound_bits)
      return false;
    for (int i = 0; i < 5; ++i)
      if (data[i] != o.data[i] || size[i] != o.size[i]) return false;
    return true;
  }
  bool operator!=(const PlanKey& o) const { return !(*this == o); }
};

inline PlanKey plan_key(const Plan& p) {
  PlanKey k;
  k.generation = p.generation();
  k.dtype = p.dtype;
  k.unit = p.unit;
  k.numel = p.numel;
  k.num_units = p.num_units;
  std::memcpy(&k.error_bound_bits, &p.error_bound, sizeof(float));
  k.data[0] = p.order.data(), k.size[0] = p.order.size();
  k.data[1] = p.bits.data(), k.size[1] = p.bits.size();
  k.data[2] = p.bias.data(), k.size[2] = p.bias.size();
  k.data[3] = p.wire_offset.data(), k.size[3] = p.wire_offset.size();
  k.data[4] = p.chunk_begin.data(), k.size[4] = p.chunk_begin.size();
  return k;
}

// The keys of the last N plans something was done for (a codec's checks),
// thread-safe: a codec is called from several threads at once. A copy starts
// empty (it is a cache).
template <int N>
class SeenPlans {
 public:
  SeenPlans() = default;
  SeenPlans(const SeenPlans&) {}
  SeenPlans& operator=(const SeenPlans&) {
    std::lock_guard<std::mutex> lock(mu_);
    for (PlanKey& k : keys_) k = PlanKey();
    return *this;
  }

  bool contains(const PlanKey& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const PlanKey& k : keys_)
      if (k == key) return true;
    return false;
  }
  // Adds `key` in place of the one added longest ago.
  void insert(const PlanKey& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const PlanKey& k : keys_)
      if (k == key) return;
    keys_[next_] = key;
    next_ = (next_ + 1) % N;
  }

 private:
  mutable std::mutex mu_;
  mutable PlanKey keys_[N];
  mutable int next_ = 0;
};

}  // namespace dynamiq
