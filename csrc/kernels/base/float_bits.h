// Bit-exact conversions between float32 and the 16-bit formats, identical on
// host and device: portable integer code, so the CPU path and the CUDA path
// round the same way (fp16 on x86 hosts: the F16C instructions, tested to give
// the same bits). Round-to-nearest-even, NaN kept quiet with its payload's top
// bits, as PyTorch's own conversions do.
#pragma once

#include <cstring>

#include "kernels/base/common.h"
#include "kernels/base/x86_intrin.h"

namespace dynamiq {

DQ_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DQ_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

DQ_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

DQ_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding_bias) >> 16);
}

// Round toward +infinity in magnitude-agnostic sense: the smallest bf16 >= f
// (for f >= 0). Used for the super-group scale so that no group scale exceeds it.
DQ_HD uint16_t f32_to_bf16_ceil_pos(float f) {
  uint32_t u = f32_bits(f);
  uint16_t h = uint16_t(u >> 16);
  if ((u & 0xffffu) != 0 && (u & 0x7f800000u) != 0x7f800000u) h = uint16_t(h + 1);
  return h;
}

DQ_HD float f16_to_f32_portable(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
    if (man) u |= 0x00400000u;  // quiet
  } else {
    u = sign | ((exp + (127 - 15)) << 23) | (man << 13);
  }
  return bits_f32(u);
}

DQ_HD uint16_t f32_to_f16_portable(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                    // result subnormal or zero
    if (a < 0x33000000u) return sign;                       // < 2^-25: rounds to 0
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;  // 14 + (113 - e) - 1 ... bring to 2^-24 units
    // value = m * 2^(e-150); in units of 2^-24: m * 2^(e-126) = m >> (126-e)
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  // normal
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  r -= (112u << 23);
  return uint16_t(sign | (r >> 13));
}

// fp16 conversions: on x86 hosts with F16C (part of x86-64-v3, the CPU
// kernels' baseline) the hardware instructions, which give the same bits as
// the portable code above in every case (tests/cpp/test_float_bits.cc checks
// both against each other and against an oracle) at a fraction of its cost;
// the portable code elsewhere (CUDA device code, other hosts).
DQ_HD float f16_to_f32(uint16_t h) {
#if !defined(__CUDA_ARCH__) && defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32_portable(h);
#endif
}

DQ_HD uint16_t f32_to_f16(float f) {
#if !defined(__CUDA_ARCH__) && defined(__F16C__)
  return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));  // round to nearest even
#else
  return f32_to_f16_portable(f);
#endif
}

template <DType T>
struct DTypeTraits;

template <>
struct DTypeTraits<DType::kF32> {
  using storage = float;
  static DQ_HD float load(const storage* p, int64_t i) { return p[i]; }
  static DQ_HD void store(storage* p, int64_t i, float v) { p[i] = v; }
  static DQ_HD float round(float v) { return v; }
  // 1 if the value is inf or nan (exponent field all ones), else 0: the one
  // non-finite test (has_nonfinite, the CUDA device's scan, dynamiq's statistics).
  static DQ_HD uint32_t nonfinite(storage v) { return (f32_bits(v) & 0x7f800000u) == 0x7f800000u ? 1u : 0u; }
};

template <>
struct DTypeTraits<DType::kBF16> {
  using storage = uint16_t;
  static DQ_HD float load(const storage* p, int64_t i) { return bf16_to_f32(p[i]); }
  static DQ_HD void store(storage* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }
  static DQ_HD float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
  static DQ_HD uint32_t nonfinite(storage v) { return (v & 0x7f80u) == 0x7f80u ? 1u : 0u; }
};

template <>
struct DTypeTraits<DType::kF16> {
  using storage = uint16_t;
  static DQ_HD float load(const storage* p, int64_t i) { return f16_to_f32(p[i]); }
  static DQ_HD void store(storage* p, int64_t i, float v) { p[i] = f32_to_f16(v); }
  static DQ_HD float round(float v) { return f16_to_f32(f32_to_f16(v)); }
  static DQ_HD uint32_t nonfinite(storage v) { return (v & 0x7c00u) == 0x7c00u ? 1u : 0u; }
};

#if !defined(__CUDA_ARCH__) && defined(__AVX2__) && defined(__F16C__)
#define DQ_HAVE_LANES8 1
// 8 values at a time between a bucket of dtype T and a float vector: lane for
// lane the same bits as DTypeTraits<T>::load / store (tests/cpp/
// test_identity_codec.cc and the DynamiQ fast-path tests compare them). gcc
// does not vectorise the fp16 conversions at all, and the bf16 rounding with
// its NaN case poorly. Unaligned pointers are fine.
template <DType T>
struct Lanes8;

template <>
struct Lanes8<DType::kF32> {
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
};

template <>
struct Lanes8<DType::kBF16> {
  static __m256 load(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // f32_to_bf16: round to nearest even by the added bias, NaN quieted with its
  // payload's top bits (u + bias cannot wrap: the largest non-NaN u is -inf's)
  static void store(uint16_t* p, __m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x0040)), nan);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
};

template <>
struct Lanes8<DType::kF16> {
  static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// v / d on 8 lanes as the scalar loops compute it: r = exact_reciprocal(d),
// a multiply when r != 0, else the division; d = 1 leaves v as it is.
inline __m256 divide8(__m256 v, float d, float r) {
  if (d == 1.0f) return v;
  return r != 0.0f ? _mm256_mul_ps(v, _mm256_set1_ps(r)) : _mm256_div_ps(v, _mm256_set1_ps(d));
}
#endif

// Runtime-to-compile-time dtype switch: DQ_DISPATCH_DTYPE(t, T, { body using T; })
#define DQ_DISPATCH_DTYPE(dtype, T, ...)                            \
  [&] {                                                             \
    switch (dtype) {                                                \
      case ::dynamiq::DType::kF32: {                                \
        constexpr ::dynamiq::DType T = ::dynamiq::DType::kF32;      \
        return __VA_ARGS__();                                       \
      }                                                             \
      case ::dynamiq::DType::kBF16: {                               \
        constexpr ::dynamiq::DType T = ::dynamiq::DType::kBF16;     \
        return __VA_ARGS__();                                       \
      }                                                             \
      case ::dynamiq::DType::kF16: {                                \
        constexpr ::dynamiq::DType T = ::dynamiq::DType::kF16;      \
        return __VA_ARGS__();                                       \
      }                                                             \
    }                                                               \
    throw ::dynamiq::Error("unsupported dtype");                    \
  }()

// 1/d when d is a positive normal power of two 2^k (1/d = 2^-k is exact): then
// v * (1/d) and v / d are the same correctly rounded value for every float v
// and the multiply is cheaper (a vector division costs ~3x a multiply on the
// x86 guests here); 0 otherwise (divide).
inline float exact_reciprocal(float d) {
  const uint32_t b = f32_bits(d);
  const bool pow2 = (b & 0x007fffffu) == 0 && b > 0 && b < 0x7f800000u;  // positive normal 2^k
  return pow2 ? 1.0f / d : 0.0f;
}

}  // namespace dynamiq
