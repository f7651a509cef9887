// Moving one unit between a rank's data (bucket or accumulator) and a float
// tile of `plan.unit` values, the working set every codec kernel computes on.
// A tile is small (1 KiB for a 256-element super-group) and stays in L1: it is
// the "registers" of the CPU kernels, not a full-precision temporary.
#pragma once

#include <cstring>

#include "codec.h"
#include "float_bits.h"

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
  const bool div = y.divisor != 1.0f;
  for (int64_t i = 0; i < cnt; ++i) {
    float v = tile[i];
    if (add) v += b;
    if (div) v /= y.divisor;
    Tr::store(p, i, v);
  }
}

inline void load_unit(const Local& x, const Plan& plan, int64_t w, float* tile) {
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] { load_unit_t<T>(x, plan, w, tile); });
}

inline void store_unit(const Output& y, const Plan& plan, int64_t w, const float* tile) {
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] { store_unit_t<T>(y, plan, w, tile); });
}

}  // namespace dynamiq
