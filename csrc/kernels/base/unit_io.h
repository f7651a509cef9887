// Moving one unit between a rank's data (bucket or accumulator) and a float
// tile of `plan.unit` values, the working set every codec kernel computes on.
// A tile is small (1 KiB for a 256-element super-group) and stays in L1: it is
// the "registers" of the CPU kernels, not a full-precision temporary.
#pragma once

#include <cstring>

#include "kernels/codec.h"
#include "kernels/base/float_bits.h"

namespace dynamiq {

template <DType T>
inline void load_unit_t(const Local& x, const Plan& plan, int64_t w, float* tile) {
  const int64_t U = plan.unit;
  if (x.acc) {
    std::memcpy(tile, x.acc + (w - x.acc_w0) * U, size_t(U) * sizeof(float));
    return;
  }
  using Tr = DTypeTraits<T>;
  const int64_t s = plan.src_unit(w);
  const int64_t cnt = plan.unit_elem_count(s);
  const auto* p = static_cast<const typename Tr::storage*>(x.bucket) + plan.unit_elem_begin(s);
#if defined(DQ_HAVE_LANES8)
  if constexpr (T == DType::kF16) {
    // 8 conversions per instruction (gcc does not vectorise the fp16 ones;
    // its own bf16 loop, a shift, measured ~1 % faster than Lanes8's);
    // the same bits as Tr::load (float_bits.h) followed by the same subtraction
    const bool sub = !plan.bias.empty();
    const float mu = sub ? plan.bias[size_t(s)] : 0.0f;
    int64_t i = 0;
    for (; i + 8 <= cnt; i += 8) {
      __m256 v = Lanes8<T>::load(p + i);
      if (sub) v = _mm256_sub_ps(v, _mm256_set1_ps(mu));
      _mm256_storeu_ps(tile + i, v);
    }
    for (; i < cnt; ++i) tile[i] = sub ? Tr::load(p, i) - mu : Tr::load(p, i);
    for (i = cnt; i < U; ++i) tile[i] = 0.0f;
    return;
  }
#endif
  if (plan.bias.empty()) {
    for (int64_t i = 0; i < cnt; ++i) tile[i] = Tr::load(p, i);
  } else {
    const float mu = plan.bias[size_t(s)];
    for (int64_t i = 0; i < cnt; ++i) tile[i] = Tr::load(p, i) - mu;
  }
  for (int64_t i = cnt; i < U; ++i) tile[i] = 0.0f;
}

template <DType T>
inline void store_unit_t(const Output& y, const Plan& plan, int64_t w, const float* tile) {
  using Tr = DTypeTraits<T>;
  const int64_t s = plan.src_unit(w);
  const int64_t cnt = plan.unit_elem_count(s);
  auto* p = static_cast<typename Tr::storage*>(y.bucket) + plan.unit_elem_begin(s);
  const bool add = !plan.bias.empty();
  const float b = add ? y.bias_scale * plan.bias[size_t(s)] : 0.0f;
  const float d = y.divisor;
  const float r = exact_reciprocal(d);
#if defined(DQ_HAVE_LANES8)
  if constexpr (T != DType::kF32) {
    // as the loops below, 8 values per vector conversion (gcc does not
    // vectorise the fp16 ones, and the bf16 rounding with its NaN case poorly)
    const __m256 bv = _mm256_set1_ps(b);
    int64_t i = 0;
    for (; i + 8 <= cnt; i += 8) {
      __m256 v = _mm256_loadu_ps(tile + i);
      if (add) v = _mm256_add_ps(v, bv);
      Lanes8<T>::store(p + i, divide8(v, d, r));
    }
    for (; i < cnt; ++i) {
      float v = add ? tile[i] + b : tile[i];
      if (d != 1.0f) v = r != 0.0f ? v * r : v / d;
      Tr::store(p, i, v);
    }
    return;
  }
#endif
  // one loop per case, so each vectorises without a per-element branch
  if (d == 1.0f) {
    for (int64_t i = 0; i < cnt; ++i) Tr::store(p, i, add ? tile[i] + b : tile[i]);
  } else if (r != 0.0f) {
    for (int64_t i = 0; i < cnt; ++i) Tr::store(p, i, (add ? tile[i] + b : tile[i]) * r);
  } else {
    for (int64_t i = 0; i < cnt; ++i) Tr::store(p, i, (add ? tile[i] + b : tile[i]) / d);
  }
}

// Software prefetch of unit w's local data (every cache line of it), for a
// loop over wire positions to issue a few units ahead: on this kind of
// machine the hardware prefetchers do not run far enough ahead of a
// compute-heavy loop, and the loads otherwise wait on DRAM one unit at a time.
// part/nparts: only that share of the unit's lines (a loop can spread them).
inline void prefetch_unit(const Local& x, const Plan& plan, int64_t w, int part = 0, int nparts = 1) {
  if (w >= plan.num_units) return;
  const char* p;
  int64_t bytes;
  if (x.acc) {
    p = reinterpret_cast<const char*>(x.acc + (w - x.acc_w0) * plan.unit);
    bytes = plan.unit * int64_t(sizeof(float));
  } else {
    const int64_t s = plan.src_unit(w);
    const int64_t esz = dtype_size(plan.dtype);
    p = static_cast<const char*>(x.bucket) + plan.unit_elem_begin(s) * esz;
    bytes = plan.unit_elem_count(s) * esz;
  }
  const int64_t lines = (bytes + 63) / 64;
  for (int64_t l = lines * part / nparts; l < lines * (part + 1) / nparts; ++l)
    __builtin_prefetch(p + 64 * l, 0, 3);
  // gcc 12 finds this function free of side effects (it does not count
  // prefetches) and deletes the calls; an empty volatile asm keeps them.
  asm volatile("" : : "r"(p));
}

inline void load_unit(const Local& x, const Plan& plan, int64_t w, float* tile) {
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] { load_unit_t<T>(x, plan, w, tile); });
}

inline void store_unit(const Output& y, const Plan& plan, int64_t w, const float* tile) {
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] { store_unit_t<T>(y, plan, w, tile); });
}

}  // namespace dynamiq
