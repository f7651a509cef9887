// CUDA's device functions for the CPU emulation (cuda_runtime.h includes
// this): warp synchronisation, shuffles and votes, with CUDA's signatures and
// the semantics of PTX's shfl.sync / vote.sync / match.sync / redux.sync /
// bar.warp.sync, and the integer intrinsics (__popc, __clz, __byte_perm, ...).
//
// A warp is 32 consecutive threads of the block (linear thread index / 32).
// Every *_sync function is a synchronisation point for the lanes its mask
// names (see run_block in cuda_emu.cc): the calling thread waits until every
// named lane has called the same function (same kind, same mask; on sm_70+ the
// call sites may differ), then each gets its result. The launch fails (stderr
// says why) where a GPU's result is undefined or it would hang: a mask that
// does not name the caller, names a lane the block does not have (the last
// warp of a block whose size is not a multiple of 32) or a lane that has
// exited, or lanes that wait at different points so none can go on. A shuffle
// reading a lane outside the mask gets 0xA5 bytes (undefined on a GPU).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

// A built-in variable on a GPU; a constant here.
constexpr int warpSize = 32;

namespace dynamiq_cuda_emu {

enum class WarpOp : uint8_t {
  sync,
  shfl_idx,
  shfl_up,
  shfl_down,
  shfl_bfly,
  ballot,
  any,
  all,
  match_any,
  match_all,
  reduce_add,
  reduce_min_u,
  reduce_max_u,
  reduce_min_s,
  reduce_max_s,
  reduce_and,
  reduce_or,
  reduce_xor,
};

// The calling thread's part in warp operation `op` over the lanes of `mask`:
// waits for them (other threads run meanwhile) and returns this lane's result.
// value: the lane's operand (bits, zero-extended); arg: source lane, delta or
// lane mask of a shuffle, operand size in bytes of a match; width: a
// shuffle's segment width.
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg = 0, int width = 32);
// The lanes of the calling thread's warp that exist and have not exited.
unsigned active_mask();

template <class T>
uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "a warp operand of at most 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof v);
  return u;
}
template <class T>
T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

}  // namespace dynamiq_cuda_emu

// ---- warp synchronisation, shuffles, votes -------------------------------------------

inline void __syncwarp(unsigned mask = 0xffffffffu) { dynamiq_cuda_emu::warp_op(dynamiq_cuda_emu::WarpOp::sync, mask, 0); }
inline unsigned __activemask() { return dynamiq_cuda_emu::active_mask(); }

// For int, unsigned, long long, unsigned long long, float, double (and any
// other trivially copyable type of up to 8 bytes, moved as its bits; CUDA
// moves 8-byte values as two 32-bit shuffles with the same lanes).
template <class T>
T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
  using namespace dynamiq_cuda_emu;
  return from_bits<T>(warp_op(WarpOp::shfl_idx, mask, to_bits(var), srcLane, width));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
  using namespace dynamiq_cuda_emu;
  return from_bits<T>(warp_op(WarpOp::shfl_up, mask, to_bits(var), int(delta & 31u), width));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
  using namespace dynamiq_cuda_emu;
  return from_bits<T>(warp_op(WarpOp::shfl_down, mask, to_bits(var), int(delta & 31u), width));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
  using namespace dynamiq_cuda_emu;
  return from_bits<T>(warp_op(WarpOp::shfl_bfly, mask, to_bits(var), laneMask, width));
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  using namespace dynamiq_cuda_emu;
  return unsigned(warp_op(WarpOp::ballot, mask, predicate != 0));
}
inline int __any_sync(unsigned mask, int predicate) {
  using namespace dynamiq_cuda_emu;
  return int(warp_op(WarpOp::any, mask, predicate != 0));
}
inline int __all_sync(unsigned mask, int predicate) {
  using namespace dynamiq_cuda_emu;
  return int(warp_op(WarpOp::all, mask, predicate != 0));
}
// unsigned, int, (unsigned) long, (unsigned) long long, float, double
template <class T>
unsigned __match_any_sync(unsigned mask, T value) {
  using namespace dynamiq_cuda_emu;
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "match.sync takes 32- or 64-bit values");
  return unsigned(warp_op(WarpOp::match_any, mask, to_bits(value), int(sizeof(T))));
}
template <class T>
unsigned __match_all_sync(unsigned mask, T value, int* pred) {
  using namespace dynamiq_cuda_emu;
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "match.sync takes 32- or 64-bit values");
  const unsigned r = unsigned(warp_op(WarpOp::match_all, mask, to_bits(value), int(sizeof(T))));
  *pred = r != 0;
  return r;
}

// sm_80's warp reductions (redux.sync)
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  return unsigned(dynamiq_cuda_emu::warp_op(dynamiq_cuda_emu::WarpOp::reduce_add, mask, value));
}
inline int __reduce_add_sync(unsigned mask, int value) { return int(__reduce_add_sync(mask, unsigned(value))); }
inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
  return unsigned(dynamiq_cuda_emu::warp_op(dynamiq_cuda_emu::WarpOp::reduce_min_u, mask, value));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  return unsigned(dynamiq_cuda_emu::warp_op(dynamiq_cuda_emu::WarpOp::reduce_max_u, mask, value));
}
inline int __reduce_min_sync(unsigned mask, int value) {
  using namespace dynamiq_cuda_emu;
  return int(unsigned(warp_op(WarpOp::reduce_min_s, mask, unsigned(value))));
}
inline int __reduce_max_sync(unsigned mask, int value) {
  using namespace dynamiq_cuda_emu;
  return int(unsigned(warp_op(WarpOp::reduce_max_s, mask, unsigned(value))));
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned value) {
  return unsigned(dynamiq_cuda_emu::warp_op(dynamiq_cuda_emu::WarpOp::reduce_and, mask, value));
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned value) {
  return unsigned(dynamiq_cuda_emu::warp_op(dynamiq_cuda_emu::WarpOp::reduce_or, mask, value));
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned value) {
  return unsigned(dynamiq_cuda_emu::warp_op(dynamiq_cuda_emu::WarpOp::reduce_xor, mask, value));
}

// ---- integer intrinsics ----------------------------------------------------------------

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return (static_cast<unsigned long long>(__brev(unsigned(x))) << 32) | __brev(unsigned(x >> 32));
}
// result byte n = byte s<4n+2:4n> of y:x (x the low four bytes)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= unsigned((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
}
// hi:lo shifted by shift & 31 (the _c forms: by min(shift, 32)); left: the high word, right: the low
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned((v << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned((v << (shift < 32u ? shift : 32u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned(v >> (shift & 31u));
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return unsigned(v >> (shift < 32u ? shift : 32u));
}
inline unsigned __umulhi(unsigned x, unsigned y) { return unsigned((static_cast<unsigned long long>(x) * y) >> 32); }
inline unsigned long long __umul64hi(unsigned long long x, unsigned long long y) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(x) * y) >> 64);
}
inline unsigned __float_as_uint(float f) { return dynamiq_cuda_emu::from_bits<unsigned>(dynamiq_cuda_emu::to_bits(f)); }
inline int __float_as_int(float f) { return dynamiq_cuda_emu::from_bits<int>(dynamiq_cuda_emu::to_bits(f)); }
inline float __uint_as_float(unsigned u) { return dynamiq_cuda_emu::from_bits<float>(u); }
inline float __int_as_float(int i) { return dynamiq_cuda_emu::from_bits<float>(unsigned(i)); }
inline long long __double_as_longlong(double d) { return static_cast<long long>(dynamiq_cuda_emu::to_bits(d)); }
inline double __longlong_as_double(long long l) { return dynamiq_cuda_emu::from_bits<double>(static_cast<uint64_t>(l)); }

// ---- cache-hinted loads and stores: plain accesses here (alignment checked as any) -----

template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcs(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}
template <class T>
T __ldlu(const T* p) {
  return *p;
}
template <class T>
void __stcs(T* p, T v) {
  *p = v;
}
template <class T>
void __stcg(T* p, T v) {
  *p = v;
}
template <class T>
void __stwt(T* p, T v) {
  *p = v;
}
