// Device helpers of the DynamiQ kernels (dynamiq_kernels.cu): the octet, 8
// contiguous values a thread holds in registers, and its loads and stores,
// each as wide as the address allows (16 bytes for values, up to 8 for wire
// bytes, which are only byte-aligned in general: a super-group's bytes follow
// the previous ones with no padding). Every array here is indexed with
// compile-time indices only (unrolled loops), so it stays in registers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/base/bytes.h"
#include "kernels/base/common.h"
#include "kernels/base/float_bits.h"

// Loop unrolling hints for nvcc (the host compiler of the CUDA emulation does
// not know them).
#if defined(__CUDACC__)
#define DQ_UNROLL _Pragma("unroll")
#define DQ_NO_UNROLL _Pragma("unroll 1")
#else
#define DQ_UNROLL
#define DQ_NO_UNROLL
#endif

namespace dynamiq {
namespace cuda {
namespace octet {

struct Oct {
  float v[8];
};

// The types of the wide accesses. In the host build (the CUDA emulation)
// they may alias any other type (a uint4 load of bf16 values), and the
// emulation's alignment check stops a misaligned access as a GPU would fault.
#if defined(__CUDA_ARCH__)
#define DQ_MAY_ALIAS
#else
#define DQ_MAY_ALIAS __attribute__((may_alias))
#endif
struct __attribute__((aligned(16))) DQ_MAY_ALIAS F4 {
  float x, y, z, w;
};
struct __attribute__((aligned(16))) DQ_MAY_ALIAS U4 {
  uint32_t x, y, z, w;
};
typedef uint64_t DQ_MAY_ALIAS U64;
typedef uint32_t DQ_MAY_ALIAS U32;
typedef uint16_t DQ_MAY_ALIAS U16;

DQ_DEVICE bool aligned_to(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

// A load or store of a T at an address aligned for T: one access.
template <class T>
DQ_DEVICE T ld(const void* p) {
  return *static_cast<const T*>(p);
}
template <class T>
DQ_DEVICE void st(void* p, const T& v) {
  *static_cast<T*>(p) = v;
}

// 16-bit storage to float
DQ_DEVICE float half_to_f32(DType dt, uint32_t h) {
  return dt == DType::kBF16 ? bf16_to_f32(uint16_t(h)) : f16_to_f32(uint16_t(h));
}
DQ_DEVICE uint32_t f32_to_half(DType dt, float v) {
  return dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

// x.v[e] = element i0 + e of a bucket of dtype dt for e < n, 0 beyond
// (n in [0, 8]); one or two 16-byte loads when all 8 are there and aligned.
DQ_DEVICE void load_values(DType dt, const void* base, int64_t i0, int n, Oct& x) {
  if (dt == DType::kF32) {
    const float* p = static_cast<const float*>(base) + i0;
    if (n == 8 && aligned_to(p, 16)) {
      const F4 a = ld<F4>(p), b = ld<F4>(p + 4);
      x.v[0] = a.x, x.v[1] = a.y, x.v[2] = a.z, x.v[3] = a.w;
      x.v[4] = b.x, x.v[5] = b.y, x.v[6] = b.z, x.v[7] = b.w;
      return;
    }
DQ_UNROLL
    for (int e = 0; e < 8; ++e) x.v[e] = e < n ? p[e] : 0.0f;
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(base) + i0;
  if (n == 8 && aligned_to(p, 16)) {
    const U4 u = ld<U4>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
DQ_UNROLL
    for (int k = 0; k < 4; ++k) {
      x.v[2 * k] = half_to_f32(dt, w[k] & 0xffffu);
      x.v[2 * k + 1] = half_to_f32(dt, w[k] >> 16);
    }
    return;
  }
DQ_UNROLL
  for (int e = 0; e < 8; ++e) x.v[e] = e < n ? half_to_f32(dt, p[e]) : 0.0f;
}

// Elements [i0, i0 + n) of a bucket of dtype dt from y.v[0, n).
DQ_DEVICE void store_values(DType dt, void* base, int64_t i0, int n, const Oct& y) {
  if (dt == DType::kF32) {
    float* p = static_cast<float*>(base) + i0;
    if (n == 8 && aligned_to(p, 16)) {
      st<F4>(p, F4{y.v[0], y.v[1], y.v[2], y.v[3]});
      st<F4>(p + 4, F4{y.v[4], y.v[5], y.v[6], y.v[7]});
      return;
    }
DQ_UNROLL
    for (int e = 0; e < 8; ++e)
      if (e < n) p[e] = y.v[e];
    return;
  }
  uint16_t* p = static_cast<uint16_t*>(base) + i0;
  if (n == 8 && aligned_to(p, 16)) {
    uint32_t w[4];
DQ_UNROLL
    for (int k = 0; k < 4; ++k) w[k] = f32_to_half(dt, y.v[2 * k]) | (f32_to_half(dt, y.v[2 * k + 1]) << 16);
    st<U4>(p, U4{w[0], w[1], w[2], w[3]});
    return;
  }
DQ_UNROLL
  for (int e = 0; e < 8; ++e)
    if (e < n) p[e] = uint16_t(f32_to_half(dt, y.v[e]));
}

// 8 floats at p (16-byte loads when aligned).
DQ_DEVICE void load_floats(const float* p, Oct& x) { load_values(DType::kF32, p, 0, 8, x); }
DQ_DEVICE void store_floats(float* p, const Oct& y) { store_values(DType::kF32, p, 0, 8, y); }

// The 8 wire bytes at p as a little-endian word, in the widest accesses p's
// alignment allows.
DQ_DEVICE uint64_t load_bytes8(const uint8_t* p) {
  if (aligned_to(p, 8)) return ld<U64>(p);
  if (aligned_to(p, 4)) return uint64_t(ld<U32>(p)) | (uint64_t(ld<U32>(p + 4)) << 32);
  if (aligned_to(p, 2)) {
    uint64_t v = 0;
DQ_UNROLL
    for (int k = 0; k < 4; ++k) v |= uint64_t(ld<U16>(p + 2 * k)) << (16 * k);
    return v;
  }
  uint64_t v = 0;
DQ_UNROLL
  for (int k = 0; k < 8; ++k) v |= uint64_t(p[k]) << (8 * k);
  return v;
}

// The low n bytes of v (n in {1, 2, 4, 8}) to p, little-endian, in the widest
// accesses p's alignment allows.
DQ_DEVICE void store_bytes(uint8_t* p, uint64_t v, int n) {
  if (n == 8 && aligned_to(p, 8)) return st<U64>(p, v);
  if (n >= 4 && aligned_to(p, 4)) {
    st<U32>(p, uint32_t(v));
    if (n == 8) st<U32>(p + 4, uint32_t(v >> 32));
    return;
  }
  if (n >= 2 && aligned_to(p, 2)) {
DQ_UNROLL
    for (int k = 0; k < 4; ++k)
      if (2 * k < n) st<U16>(p + 2 * k, uint16_t(v >> (16 * k)));
    return;
  }
DQ_UNROLL
  for (int k = 0; k < 8; ++k)
    if (k < n) p[k] = uint8_t(v >> (8 * k));
}

}  // namespace octet
}  // namespace cuda
}  // namespace dynamiq
