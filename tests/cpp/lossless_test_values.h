// Values for the lossless CUDA tests (cuda_lossless.cu, cuda_lossless_decode.cu).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/codec.h"

namespace dynamiq {
namespace dqtest {

// n values of dtype t: Gaussian gradients (kind 0), the same with every 7th a random
// bit pattern (NaNs, infs, subnormals; kind 1), or all 1.5 (kind 2: one exponent).
inline std::vector<uint8_t> lossless_values(DType t, int64_t n, int kind, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1e-3f);
  const int es = dtype_size(t);
  std::vector<uint8_t> v(size_t(n * es));
  for (int64_t i = 0; i < n; ++i) {
    const float f = kind == 2 ? 1.5f : nd(g);
    uint32_t w = t == DType::kF32 ? f32_bits(f) : t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
    if (kind == 1 && i % 7 == 0) w = uint32_t(g());
    std::memcpy(v.data() + i * es, &w, size_t(es));
  }
  return v;
}

}  // namespace dqtest
}  // namespace dynamiq
