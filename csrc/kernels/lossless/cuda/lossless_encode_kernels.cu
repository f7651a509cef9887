// CUDA kernels of the lossless encode (lossless_encode_cuda, ../lossless_cuda.h):
// four launches and no host wait per message.
//   1. split_kernel: SM planes, tail and body exponents, 16-byte loads, the
//      exponent histogram in shared memory, added to the state's.
//   2. plan_kernel (lossless_plan_kernel.cu): the host's format choice on the
//      device; writes the section's table.
//   3. size_kernel: a warp per 1024-exponent segment sums its escapes (zip) or
//      code lengths (Huffman); the last block to finish scans the segment sizes
//      and writes the header and the section's size for the caller's one wait.
//   4. section_kernel: a warp per segment writes the section: each lane owns 32
//      exponents (4 groups); warp prefix sums place its escapes (zip) or its
//      bits (Huffman, assembled with atomicOr in a shared-memory buffer and
//      stored as aligned words); plain copies or bit-planes the exponents.
// Every byte equals the CPU encoder's (lossless_codec.cc), which shares the
// per-element functions of lossless_format.h.
#include <cuda_runtime.h>

#include "kernels/base/cuda/launch.h"
#include "kernels/lossless/cuda/lossless_device.h"
#include "kernels/lossless/lossless_cuda.h"
#include "kernels/lossless/lossless_validate.h"

namespace dynamiq {
namespace {

using namespace lossless;
using namespace lossless_dev;

void check(cudaError_t e, const char* what) { cuda::check(e, "lossless CUDA", what); }

constexpr int kSplitThreads = 256;
// Sub-histograms in shared memory (by warp): gradients' exponents crowd onto a
// few values, and fewer warps per counter collide less.
constexpr int kHistCopies = 4;
// Groups of 8 values per split thread: 32 bytes of loads in flight each.
template <DType T>
constexpr int kGroupsPerThread = T == DType::kF32 ? 1 : 2;
// A Huffman segment's bits in shared memory: kMaxStreamBytes and a word of slack for the funnel shift.
constexpr int kBitWords = (kMaxStreamBytes + 3) / 4 + 4;

// ---- 1. split and histogram ------------------------------------------------------

// The 8 values of a group in registers (16-bit dtypes: one 16-byte load; fp32: two).
template <DType T>
struct GroupWords {
  uint4 q[T == DType::kF32 ? 2 : 1];
};

// Group g's SM bytes and exponents (ex: byte j = exponent of value j) from its
// words; sm points at the SM planes (message + 16), which is 16-byte aligned.
// Two 16-bit values per 32-bit word: masks and shifts act on both, byte
// permutes gather the bytes (the fields are Split<T>'s, tested against it).
template <DType T>
__device__ inline uint64_t split_words(const GroupWords<T>& in, int64_t g, int64_t G, uint8_t* sm) {
  const auto pack8 = [](uint32_t a, uint32_t b, uint32_t c, uint32_t d) {  // bytes 0 and 2 of each word
    return __byte_perm(a, b, 0x6420) | uint64_t(__byte_perm(c, d, 0x6420)) << 32;
  };
  if constexpr (T == DType::kBF16) {
    const uint4 q = in.q[0];
    const auto e = [](uint32_t w) { return (w >> 7) & 0x00ff00ffu; };
    const auto s = [](uint32_t w) { return (w & 0x007f007fu) | ((w >> 8) & 0x00800080u); };
    stv(sm + 8 * g, pack8(s(q.x), s(q.y), s(q.z), s(q.w)));
    return pack8(e(q.x), e(q.y), e(q.z), e(q.w));
  } else if constexpr (T == DType::kF16) {
    const uint4 q = in.q[0];
    const auto e = [](uint32_t w) { return (w >> 10) & 0x001f001fu; };
    const auto lo = [](uint32_t w) { return w & 0x00ff00ffu; };
    const auto hi3 = [](uint32_t w) { return ((w >> 8) & 0x00030003u) | ((w >> 13) & 0x00040004u); };
    stv(sm + 8 * g, pack8(lo(q.x), lo(q.y), lo(q.z), lo(q.w)));
    const uint64_t h = pack8(hi3(q.x), hi3(q.y), hi3(q.z), hi3(q.w));
    for (int k = 0; k < 3; ++k) sm[8 * G + k * G + g] = pack_plane(h, k);
    return pack8(e(q.x), e(q.y), e(q.z), e(q.w));
  } else {
    // per 4 values: their bytes 2 and 3 gathered, sign = bit 7 of byte 3,
    // exponent = byte 3's low 7 bits and byte 2's bit 7, mantissa[22:16] = byte 2's low 7
    uint32_t hi[2], ex[2];
    uint4 lo;
    DQ_UNROLL
    for (int k = 0; k < 2; ++k) {
      const uint4 q = in.q[k];
      const uint32_t p = __byte_perm(q.x, q.y, 0x7362), r = __byte_perm(q.z, q.w, 0x7362);
      const uint32_t b2 = __byte_perm(p, r, 0x5410), b3 = __byte_perm(p, r, 0x7632);
      hi[k] = (b2 & 0x7f7f7f7fu) | (b3 & 0x80808080u);
      ex[k] = ((b3 & 0x7f7f7f7fu) << 1) | ((b2 >> 7) & 0x01010101u);
      (k ? lo.z : lo.x) = __byte_perm(q.x, q.y, 0x5410);
      (k ? lo.w : lo.y) = __byte_perm(q.z, q.w, 0x5410);
    }
    stv(sm + 16 * g, lo);
    stv(sm + 16 * G + 8 * g, hi[0] | uint64_t(hi[1]) << 32);
    return ex[0] | uint64_t(ex[1]) << 32;
  }
}

// Each thread splits kGroupsPerThread groups (a warp's loads are contiguous)
// and counts their exponents; the block adds its histogram to st->hist.
// kVec: values, message and exps 16-byte aligned (else split_group's byte loop).
template <DType T, bool kVec>
__global__ void __launch_bounds__(kSplitThreads)
    split_kernel(const typename Split<T>::word* __restrict__ v, Layout L, uint8_t* __restrict__ msg,
                 uint8_t* __restrict__ exps, LosslessEncodeState* st) {
  using W = typename Split<T>::word;
  constexpr int R = kGroupsPerThread<T>;
  __shared__ uint32_t hist[kHistCopies][256];
  const int tid = int(threadIdx.x);
  static_assert(kSplitThreads == 256, "a thread per exponent value");
  DQ_UNROLL
  for (int k = 0; k < kHistCopies; ++k) hist[k][tid] = 0;
  __syncthreads();
  uint32_t* h = hist[(tid / kWarp) % kHistCopies];
  const int64_t G = L.groups;
  uint8_t* sm = msg + kHeaderBytes;
  const int64_t g0 = int64_t(blockIdx.x) * (R * kSplitThreads) + tid;
  if constexpr (kVec) {
    GroupWords<T> in[R];
    DQ_UNROLL
    for (int r = 0; r < R; ++r) {  // every load first
      const int64_t g = g0 + r * kSplitThreads;
      if (g < G)
        DQ_UNROLL
        for (int q = 0; q < int(sizeof(in[r].q) / 16); ++q) in[r].q[q] = ldv<uint4>(v + 8 * g + q * (16 / sizeof(W)));
    }
    DQ_UNROLL
    for (int r = 0; r < R; ++r) {
      const int64_t g = g0 + r * kSplitThreads;
      if (g >= G) break;
      const uint64_t ex = split_words<T>(in[r], g, G, sm);
      stv(exps + 8 * g, ex);
      DQ_UNROLL
      for (int j = 0; j < 8; ++j) atomicAdd(&h[(ex >> (8 * j)) & 0xff], 1u);
    }
  } else {
    for (int r = 0; r < R; ++r) {
      const int64_t g = g0 + r * kSplitThreads;
      if (g >= G) break;
      split_group<T>(v, g, G, sm, exps);
      for (int j = 0; j < 8; ++j) atomicAdd(&h[exps[8 * g + j]], 1u);
    }
  }
  if (blockIdx.x == 0 && tid < L.tail) {  // the tail, verbatim
    const W w = v[L.body + tid];
    for (int b = 0; b < int(sizeof(W)); ++b) msg[L.tail_offset + tid * int64_t(sizeof(W)) + b] = uint8_t(w >> (8 * b));
  }
  __syncthreads();
  uint32_t c = 0;
  DQ_UNROLL
  for (int k = 0; k < kHistCopies; ++k) c += hist[k][tid];
  if (c) atomicAdd(&st->hist[tid], c);
}

// ---- a lane's 32 exponents of segment s ----------------------------------------------

// The exponents a lane owns: x[j] = group j's 8 bytes, for j < ng (0..4).
struct LaneExps {
  uint64_t x[4];
  int ng;
};
__device__ inline LaneExps lane_exps(const uint8_t* __restrict__ exps, int64_t body, int64_t s, int lane) {
  LaneExps r;
  const int cnt = segment_count(body, s) - 32 * lane;  // a multiple of 8
  r.ng = cnt <= 0 ? 0 : cnt >= 32 ? 4 : cnt / 8;
  const uint8_t* p = exps + s * kSegment + 32 * lane;  // 32-byte aligned
  if (r.ng == 4) {
    const uint4 a = ldv<uint4>(p), b = ldv<uint4>(p + 16);
    r.x[0] = a.x | uint64_t(a.y) << 32;
    r.x[1] = a.z | uint64_t(a.w) << 32;
    r.x[2] = b.x | uint64_t(b.y) << 32;
    r.x[3] = b.z | uint64_t(b.w) << 32;
  } else {
    DQ_UNROLL
    for (int j = 0; j < 4; ++j) r.x[j] = j < r.ng ? ldv<uint64_t>(p + 8 * j) : 0;
  }
  return r;
}

// Byte j of v (j < n) at p[j]; one aligned 32-bit store when n = 4 and p allows.
__device__ inline void store_bytes4(uint8_t* p, uint32_t v, int n) {
  if (n == 4 && (reinterpret_cast<uintptr_t>(p) & 3) == 0) {
    stv(p, v);
    return;
  }
  for (int j = 0; j < n; ++j) p[j] = uint8_t(v >> (8 * j));
}

// ---- 3. segment sizes, the scan, the header ----------------------------------------

__global__ void __launch_bounds__(kSegThreads)
    size_kernel(uint8_t dtype, Layout L, LosslessEncodeState* st, const uint8_t* __restrict__ exps, uint32_t* sizes,
                uint32_t* start, uint8_t* msg, uint32_t* dynamic) {
  __shared__ uint32_t cost[256];  // zip: 1 for an escaped exponent; Huffman: its code length
  __shared__ unsigned long long part[kSegWarps + 1];
  __shared__ int last;
  const int tid = int(threadIdx.x), lane = lane_id();
  const ExpFormat f = ExpFormat(st->format);
  const bool zip = f == ExpFormat::kZip, coded = zip || f == ExpFormat::kHuffman;
  const int64_t S = L.segments;
  if (coded) {  // uniform
    for (int e = tid; e < 256; e += kSegThreads) cost[e] = zip ? uint32_t(st->code_of[e] == 0) : st->huff[e] >> 16;
    __syncthreads();
    const int64_t s = int64_t(blockIdx.x) * kSegWarps + tid / kWarp;
    if (s < S) {  // uniform in the warp
      const LaneExps x = lane_exps(exps, L.body, s, lane);
      uint32_t c = 0;
      DQ_UNROLL
      for (int j = 0; j < 4; ++j)
        if (j < x.ng)
          DQ_UNROLL
          for (int b = 0; b < 8; ++b) c += cost[(x.x[j] >> (8 * b)) & 0xff];
      c = warp_sum(c);
      if (lane == 0) sizes[s] = zip ? c : (c + 7) / 8;
    }
  }
  fence();  // this block's sizes, before its count
  __syncthreads();
  if (tid == 0) last = atomicAdd(&st->done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;  // uniform
  // The last block: every size is written.
  unsigned long long total = 0;
  if (coded) total = block_scan(S, [&](int64_t s) -> uint32_t { return load_cg(sizes + s); }, start, part);
  if (tid == 0) {
    int64_t dyn = st->bound;  // plain, const: exact
    if (zip && zip_section_bytes(L, int64_t(total)) != dyn) dyn = -1;  // the plan's count disagrees: a bug
    if (f == ExpFormat::kHuffman) {
      dyn = st->prefix_bytes + 2 * S + int64_t(total);
      if (dyn > st->bound) dyn = -1;  // cannot happen: a bug
    }
    if (dyn >= 0) write_header(msg, dtype, uint32_t(L.n), uint8_t(f), uint32_t(dyn));
    *dynamic = dyn >= 0 ? uint32_t(dyn) : 0xffffffffu;
    st->done = 0;
  }
}

// ---- 4. the section ----------------------------------------------------------------

__device__ inline uint8_t buf_byte(const uint32_t* buf, uint32_t b) { return uint8_t(buf[b / 4] >> (8 * (b % 4))); }

// Segment s's Huffman stream (x: the lane's exponents; tab[e] = reversed code | length << 16)
// at dst, whose first `bits` bits the warp assembles in buf; returns the stream's bytes.
__device__ uint32_t huff_segment_warp(const LaneExps& x, const uint32_t* tab, uint32_t* buf, uint8_t* dst,
                                      bool write) {
  const int lane = lane_id();
  uint32_t nb = 0;
  DQ_UNROLL
  for (int j = 0; j < 4; ++j)
    if (j < x.ng)
      DQ_UNROLL
      for (int b = 0; b < 8; ++b) nb += tab[(x.x[j] >> (8 * b)) & 0xff] >> 16;
  const uint32_t incl = warp_inclusive_sum(nb);
  const uint32_t bits = __shfl_sync(kFullMask, incl, kWarp - 1), bytes = (bits + 7) / 8;
  if (!write) return bytes;
  const uint32_t words = (bits + 31) / 32 + 1;
  for (uint32_t w = lane; w < words; w += kWarp) buf[w] = 0;
  __syncwarp();
  // This lane's codes from bit incl - nb on: whole words by atomicOr (a
  // lane's first and last words are shared with its neighbours).
  const uint32_t off = incl - nb;
  uint32_t word = off / 32, have = off % 32;
  uint64_t acc = 0;
  DQ_UNROLL
  for (int j = 0; j < 4; ++j) {
    if (j >= x.ng) break;
    DQ_UNROLL
    for (int b = 0; b < 8; ++b) {
      const uint32_t t = tab[(x.x[j] >> (8 * b)) & 0xff];
      acc |= uint64_t(t & 0xffffu) << have;
      have += t >> 16;
      if (have >= 32) {
        atomicOr(&buf[word++], uint32_t(acc));
        acc >>= 32;
        have -= 32;
      }
    }
  }
  if (have) atomicOr(&buf[word], uint32_t(acc));
  __syncwarp();
  // Out: the bytes up to dst's next 4-byte boundary, then aligned words, then the rest.
  const uint32_t misalign = uint32_t(-reinterpret_cast<uintptr_t>(dst) & 3u);
  const uint32_t head = misalign < bytes ? misalign : bytes;
  const uint32_t mid = (bytes - head) / 4, rest = bytes - head - 4 * mid;
  if (uint32_t(lane) < head) dst[lane] = buf_byte(buf, lane);
  for (uint32_t i = lane; i < mid; i += kWarp) {
    const uint32_t o = head + 4 * i, lo = buf[o / 4], hi = buf[o / 4 + 1];
    stv(dst + o, head ? (lo >> (8 * head)) | (hi << (32 - 8 * head)) : lo);
  }
  if (uint32_t(lane) < rest) dst[head + 4 * mid + lane] = buf_byte(buf, head + 4 * mid + lane);
  return bytes;
}

__global__ void __launch_bounds__(kSegThreads)
    section_kernel(uint8_t dtype, Layout L, const LosslessEncodeState* st, const uint8_t* __restrict__ exps,
                   const uint32_t* __restrict__ start, uint8_t* msg) {
  __shared__ uint32_t tab[256];  // zip: code; Huffman: reversed code | length << 16
  __shared__ uint32_t bitbuf[kSegWarps][kBitWords];
  const int tid = int(threadIdx.x), lane = lane_id(), warp = tid / kWarp;
  const ExpFormat f = ExpFormat(st->format);
  if (f == ExpFormat::kConst) return;  // plan_kernel wrote its byte
  const bool zip = f == ExpFormat::kZip;
  if (zip || f == ExpFormat::kHuffman) {  // uniform
    for (int e = tid; e < 256; e += kSegThreads) tab[e] = zip ? st->code_of[e] : st->huff[e];
    __syncthreads();
  }
  const int64_t S = L.segments, G = L.groups, s = int64_t(blockIdx.x) * kSegWarps + warp;
  if (s >= S) return;  // uniform in the warp
  const LaneExps x = lane_exps(exps, L.body, s, lane);
  uint8_t* sec = msg + L.static_bytes;
  const int64_t g0 = s * (kSegment / kGroup) + 4 * lane;  // the lane's first group
  if (f == ExpFormat::kPlain) {
    if (DType(dtype) == DType::kF16) {  // 5 bit planes
      for (int k = 0; k < 5; ++k) {
        uint32_t w = 0;
        DQ_UNROLL
        for (int j = 0; j < 4; ++j)
          if (j < x.ng) w |= uint32_t(pack_plane(x.x[j], k)) << (8 * j);
        store_bytes4(sec + k * G + g0, w, x.ng);
      }
    } else {  // the exponent bytes
      uint8_t* d = sec + 8 * g0;
      if (x.ng == 4 && aligned16(sec)) {
        uint4 a, b;
        a.x = uint32_t(x.x[0]), a.y = uint32_t(x.x[0] >> 32), a.z = uint32_t(x.x[1]), a.w = uint32_t(x.x[1] >> 32);
        b.x = uint32_t(x.x[2]), b.y = uint32_t(x.x[2] >> 32), b.z = uint32_t(x.x[3]), b.w = uint32_t(x.x[3] >> 32);
        stv(d, a);
        stv(d + 16, b);
      } else {
        DQ_UNROLL
        for (int j = 0; j < 4; ++j)
          if (j < x.ng) store_u64(d + 8 * j, x.x[j]);
      }
    }
    return;
  }
  if (zip) {
    uint8_t* meta = sec + kZipTableBytes;
    uint8_t* planes = meta + 2 * S;
    uint8_t* esc = planes + 3 * G;
    uint64_t codes[4];
    uint32_t p[3] = {0, 0, 0}, n_esc = 0;
    DQ_UNROLL
    for (int j = 0; j < 4; ++j) {
      codes[j] = 0;
      if (j < x.ng) {
        DQ_UNROLL
        for (int b = 0; b < 8; ++b) codes[j] |= uint64_t(tab[(x.x[j] >> (8 * b)) & 0xff]) << (8 * b);
        uint32_t any = 0;
        DQ_UNROLL
        for (int k = 0; k < 3; ++k) {
          const uint32_t plane = pack_plane(codes[j], k);
          p[k] |= plane << (8 * j);
          any |= plane;
        }
        n_esc += uint32_t(popc32(~any & 0xffu));
      }
    }
    const uint32_t incl = warp_inclusive_sum(n_esc);
    uint8_t* out = esc + start[s] + (incl - n_esc);
    DQ_UNROLL
    for (int j = 0; j < 4; ++j)
      if (j < x.ng)
        DQ_UNROLL
        for (int b = 0; b < 8; ++b)
          if (((codes[j] >> (8 * b)) & 0xff) == 0) *out++ = uint8_t(x.x[j] >> (8 * b));
    DQ_UNROLL
    for (int k = 0; k < 3; ++k) store_bytes4(planes + k * G + g0, p[k], x.ng);
    if (lane == kWarp - 1) store_u16(meta + 2 * s, uint16_t(incl));
    return;
  }
  // Huffman. A stream past the plan's bound (size_kernel then reports a bug) is not written.
  uint8_t* meta = sec + st->prefix_bytes;
  uint8_t* streams = meta + 2 * S;
  const bool fits = st->prefix_bytes + 2 * S + int64_t(start[s + 1]) <= st->bound;
  const uint32_t bytes = huff_segment_warp(x, tab, bitbuf[warp], streams + start[s], fits);
  if (lane == 0) store_u16(meta + 2 * s, uint16_t(bytes));
}

}  // namespace

size_t lossless_encode_state_bytes() { return sizeof(LosslessEncodeState); }

void lossless_encode_cuda(DType dtype, const void* values, int64_t n, uint8_t* msg, uint32_t formats,
                          const LosslessEncodeScratch& sc, cudaStream_t stream) {
  const Layout L = make_layout(dtype, n);
  DQ_DISPATCH_DTYPE(dtype, T, [&] {
    using W = typename Split<T>::word;
    const W* v = static_cast<const W*>(values);
    constexpr int64_t per_block = int64_t(kGroupsPerThread<T>) * kSplitThreads;
    const unsigned grid = unsigned(L.groups > 0 ? (L.groups + per_block - 1) / per_block : 1);
    if (aligned16(values) && aligned16(msg) && aligned16(sc.exps))
      DQ_LAUNCH((split_kernel<T, true>), grid, kSplitThreads, 0, stream)(v, L, msg, sc.exps, sc.state);
    else
      DQ_LAUNCH((split_kernel<T, false>), grid, kSplitThreads, 0, stream)(v, L, msg, sc.exps, sc.state);
  });
  check(cudaGetLastError(), "split kernel");
  lossless_plan_cuda(dtype, n, formats, sc.state, msg, stream);
  check(cudaGetLastError(), "plan kernel");
  const unsigned seg_grid = unsigned(L.segments > 0 ? (L.segments + kSegWarps - 1) / kSegWarps : 1);
  DQ_LAUNCH(size_kernel, seg_grid, kSegThreads, 0, stream)(uint8_t(dtype), L, sc.state, sc.exps, sc.sizes, sc.start,
                                                           msg, sc.dynamic);
  check(cudaGetLastError(), "size kernel");
  DQ_LAUNCH(section_kernel, seg_grid, kSegThreads, 0, stream)(uint8_t(dtype), L, sc.state, sc.exps, sc.start, msg);
  check(cudaGetLastError(), "section kernel");
}

}  // namespace dynamiq
