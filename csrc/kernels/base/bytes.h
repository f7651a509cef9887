// Little-endian loads and stores of 16-, 32- and 64-bit words in byte buffers:
// the one set the wire formats use (lossless, bitsplit, dynamiq), on the host
// and in the CUDA kernels.
//  - load_uN / store_uN: any address. Host: memcpy (one unaligned access on
//    x86); device: byte by byte (a device access must be aligned).
//  - load_uN_aligned / store_uN_aligned: the caller guarantees an N/8-byte
//    aligned address; one word access on the device too.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/base/common.h"

#if !defined(__CUDA_ARCH__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dynamiq's wire formats are little-endian; the host paths below assume a little-endian CPU"
#endif

namespace dynamiq {
namespace bytes_detail {

template <class T>
DQ_HD T load_bytewise(const uint8_t* p) {
  T v = 0;
  for (int i = int(sizeof(T)) - 1; i >= 0; --i) v = T((v << 8) | p[i]);
  return v;
}
template <class T>
DQ_HD void store_bytewise(uint8_t* p, T v) {
  for (int i = 0; i < int(sizeof(T)); ++i) p[i] = uint8_t(v >> (8 * i));
}
template <class T>
DQ_HD T load(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return load_bytewise<T>(p);
#else
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
template <class T>
DQ_HD void store(uint8_t* p, T v) {
#if defined(__CUDA_ARCH__)
  store_bytewise<T>(p, v);
#else
  std::memcpy(p, &v, sizeof v);
#endif
}
template <class T>
DQ_HD T load_aligned(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const T*>(p);
#else
  return load<T>(p);
#endif
}
template <class T>
DQ_HD void store_aligned(uint8_t* p, T v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<T*>(p) = v;
#else
  store<T>(p, v);
#endif
}

}  // namespace bytes_detail

DQ_HD uint16_t load_u16(const uint8_t* p) { return bytes_detail::load<uint16_t>(p); }
DQ_HD uint32_t load_u32(const uint8_t* p) { return bytes_detail::load<uint32_t>(p); }
DQ_HD uint64_t load_u64(const uint8_t* p) { return bytes_detail::load<uint64_t>(p); }
DQ_HD void store_u16(uint8_t* p, uint16_t v) { bytes_detail::store(p, v); }
DQ_HD void store_u32(uint8_t* p, uint32_t v) { bytes_detail::store(p, v); }
DQ_HD void store_u64(uint8_t* p, uint64_t v) { bytes_detail::store(p, v); }

DQ_HD uint16_t load_u16_aligned(const uint8_t* p) { return bytes_detail::load_aligned<uint16_t>(p); }
DQ_HD uint32_t load_u32_aligned(const uint8_t* p) { return bytes_detail::load_aligned<uint32_t>(p); }
DQ_HD void store_u16_aligned(uint8_t* p, uint16_t v) { bytes_detail::store_aligned(p, v); }
DQ_HD void store_u32_aligned(uint8_t* p, uint32_t v) { bytes_detail::store_aligned(p, v); }

// Up to 8 bytes from p, of which only `avail` may be read; the rest read as 0.
DQ_HD uint64_t load_u64_bounded(const uint8_t* p, uint64_t avail) {
  uint64_t v = 0;
  const int n = avail < 8 ? int(avail) : 8;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace dynamiq
