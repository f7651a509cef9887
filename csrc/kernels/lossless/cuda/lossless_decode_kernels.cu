// CUDA kernels of the lossless decode (lossless_decode_cuda, ../lossless_cuda.h):
// three launches, no host wait.
//   1. parse_kernel (one block): the header and the section's tables, checked
//      by lossless_validate.h's functions; the per-segment sizes scanned; the
//      Huffman decode table built.
//   2. section_kernel: a warp per 1024-exponent segment of a zip or Huffman
//      section. Zip: each lane decodes 4 groups' codes, a warp prefix sum of
//      the escapes places its escape reads. Huffman: the lanes decode 32
//      slices of the stream's bits from guessed starts and correct the guesses
//      until each slice starts where the one before it ends (below); a prefix
//      sum of the codes per slice places each lane's symbols.
//   3. merge_kernel: a thread per 8-value group (two for 16-bit dtypes): SM
//      planes and exponents (the section kernel's, or read in place: const,
//      aligned bf16/float32 plain) merged into the values with byte permutes
//      and 16-byte stores; only if the message passed every check.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/base/cuda/launch.h"
#include "kernels/lossless/cuda/lossless_device.h"
#include "kernels/lossless/lossless_cuda.h"
#include "kernels/lossless/lossless_validate.h"

namespace dynamiq {
namespace {

using namespace lossless;
using namespace lossless_dev;

void check(cudaError_t e, const char* what) { cuda::check(e, "lossless CUDA", what); }

constexpr int kThreads = 256;       // merge
// Groups of 8 values per merge thread (strided by the block: a warp's accesses stay contiguous).
template <DType T>
constexpr int kMergeGroups = T == DType::kF32 ? 1 : 2;
constexpr int kParseThreads = 256;  // the parse's one block
// A segment's stream staged in shared memory: at most kMaxStreamBytes, the 8
// bytes past it a decoder may peek, and a zero word for the 64-bit window.
constexpr int kStageWords = (kMaxStreamBytes + 8 + 3) / 4 + 1;
constexpr uint32_t kDead = 0xffffffffu;  // a slice after an invalid code: no start

// ---- 1. parse -------------------------------------------------------------------------

// One block: the header and the tables (thread 0, lossless_validate.h), the
// per-segment sizes scanned into seg_start by every thread, the Huffman decode
// table built in parallel. Writes *P, whose fault says whether it parsed.
__global__ void __launch_bounds__(kParseThreads, 1)
    parse_kernel(DType dtype, const uint8_t* msg, uint64_t in_bytes, int64_t n, LosslessDevicePlan* P,
                 uint32_t* seg_start, uint16_t* table) {
  __shared__ Fault f;
  __shared__ Tables t;
  __shared__ uint8_t format;
  __shared__ unsigned long long part[kParseThreads / kWarp + 1];
  __shared__ int counts_bad;
  __shared__ uint32_t len_count[kMaxCodeLen + 1], next_code[kMaxCodeLen + 1];
  const int tid = int(threadIdx.x);
  const Layout L = make_layout(dtype, n);
  const int64_t S = L.segments;
  const uint8_t* sec = msg + L.static_bytes;
  if (tid == 0) {
    Header h{};
    f = Fault{};
    t = Tables{};
    counts_bad = 0;
    format = 0;
    if (in_bytes < uint64_t(L.static_bytes)) f = fault(FaultKind::kTruncated, int64_t(in_bytes), L.static_bytes);
    if (f.kind == FaultKind::kNone) f = check_header(msg, dtype, L, h);
    if (f.kind == FaultKind::kNone && in_bytes != uint64_t(L.static_bytes) + h.dynamic_bytes)
      f = fault(FaultKind::kSize, int64_t(in_bytes), L.static_bytes + int64_t(h.dynamic_bytes));
    if (f.kind == FaultKind::kNone) {
      format = h.format;
      f = check_tables(ExpFormat(h.format), sec, h.dynamic_bytes, dtype, L, t);
    }
  }
  if (tid <= kMaxCodeLen) len_count[tid] = 0;
  __syncthreads();
  const ExpFormat fmt = ExpFormat(format);
  if (f.kind == FaultKind::kNone && (fmt == ExpFormat::kZip || fmt == ExpFormat::kHuffman)) {  // uniform
    const uint8_t* meta = sec + t.meta_offset;
    const bool zip = fmt == ExpFormat::kZip;
    const unsigned long long total = block_scan(
        S,
        [&](int64_t s) -> uint32_t {
          const uint32_t c = load_u16(meta + 2 * s);
          if (zip && !zip_count_ok(c, L.body, s)) counts_bad = 1;
          return c;
        },
        seg_start, part);
    if (tid == 0)  // (seg_start is read only if this passes: a refused total may have wrapped it)
      f = counts_bad ? fault(FaultKind::kZipCount) : check_segment_total(fmt, total, t.payload_bytes);
    if (!zip) {
      for (int i = tid; i < kDecodeTableSize; i += kParseThreads) table[i] = 0;
      for (int i = tid; i < t.k; i += kParseThreads) atomicAdd(&len_count[t.len[i]], 1u);
    }
    __syncthreads();
    if (f.kind == FaultKind::kNone && !zip) {  // uniform: canonical codes, as huff_reversed_codes
      if (tid == 0) {
        uint32_t c = 0;
        next_code[0] = 0;
        for (int l = 1; l <= kMaxCodeLen; ++l) {
          c = (c + len_count[l - 1]) << 1;
          next_code[l] = c;
        }
      }
      __syncthreads();
      for (int i = tid; i < t.k; i += kParseThreads) {
        const int l = t.len[i];
        uint32_t c = next_code[l];
        for (int j = 0; j < i; ++j) c += t.len[j] == l;
        huff_fill_entries(sec[1 + i], uint16_t(reverse_bits(c, l)), l, table);
      }
    }
  }
  if (tid == 0) {
    LosslessDevicePlan p;
    p.fault = f;
    p.fault.dtype = int32_t(dtype);
    p.format = format;
    p.constant = t.constant;
    p.const_exps = 0x0101010101010101ull * t.constant;
    for (int i = 0; i < 8; ++i) p.zip_table[i] = t.zip_table[i];
    p.planes_offset = t.planes_offset;
    p.payload_offset = t.payload_offset;
    p.payload_bytes = t.payload_bytes;
    *P = p;
  }
}

// ---- 2. sections: a warp per segment ------------------------------------------------------

// Whether the merge reads a plain section's exponent bytes in place (bf16 and float32, at an
// 8-byte aligned address); otherwise the section kernel writes them to exps.
__device__ inline bool plain_in_place(DType t, ExpFormat f, const uint8_t* sec) {
  return f == ExpFormat::kPlain && t != DType::kF16 && (reinterpret_cast<uintptr_t>(sec) & 7) == 0;
}

// 4 bytes from p (n < 4: the first n, the rest 0): one aligned load when it can.
__device__ inline uint32_t load_bytes4(const uint8_t* p, int n) {
  if (n == 4 && (reinterpret_cast<uintptr_t>(p) & 3) == 0) return ldv<uint32_t>(p);
  uint32_t v = 0;
  for (int j = 0; j < n; ++j) v |= uint32_t(p[j]) << (8 * j);
  return v;
}

// Zip segment s: lane l decodes groups [4l, 4l + 4) of it into exps; false if
// its codes use other than the announced escapes [begin, end).
__device__ bool zip_segment_warp(const uint8_t* planes, const uint8_t* esc, int64_t G, int64_t body, int64_t s,
                                 uint32_t begin, uint32_t end, const uint8_t* ztab, uint8_t* exps) {
  const int lane = lane_id();
  const int cnt = segment_count(body, s) - 32 * lane;
  const int ng = cnt <= 0 ? 0 : cnt >= 32 ? 4 : cnt / 8;  // the lane's groups
  const int64_t g0 = s * (kSegment / kGroup) + 4 * lane;
  const uint32_t p0 = load_bytes4(planes + g0, ng), p1 = load_bytes4(planes + G + g0, ng),
                 p2 = load_bytes4(planes + 2 * G + g0, ng);
  const uint32_t valid = ng == 4 ? 0xffffffffu : (1u << (8 * ng)) - 1u;
  const uint32_t n_esc = uint32_t(popc32(~(p0 | p1 | p2) & valid));
  const uint32_t incl = warp_inclusive_sum(n_esc);
  const bool ok = __shfl_sync(kFullMask, incl, kWarp - 1) == end - begin;  // uniform
  uint32_t pos = begin + incl - n_esc;
  uint8_t* out = exps + s * kSegment + 32 * lane;
  DQ_UNROLL
  for (int j = 0; j < 4; ++j) {
    if (j >= ng) break;
    const uint64_t codes = unpack_plane(uint8_t(p0 >> (8 * j))) | (unpack_plane(uint8_t(p1 >> (8 * j))) << 1) |
                           (unpack_plane(uint8_t(p2 >> (8 * j))) << 2);
    uint64_t x = 0;
    DQ_UNROLL
    for (int b = 0; b < 8; ++b) {
      const uint32_t c = uint32_t(codes >> (8 * b)) & 7u;
      const uint8_t e = c ? ztab[c] : ok ? esc[pos++] : 0;
      x |= uint64_t(e) << (8 * b);
    }
    stv(out + 8 * j, x);
  }
  return ok;
}

// The staged stream's bits from bit `pos` on: at least 33 valid, room for three codes.
__device__ inline uint64_t window(const uint32_t* stage, uint32_t pos) {
  return (stage[pos / 32] | uint64_t(stage[pos / 32 + 1]) << 32) >> (pos % 32);
}
constexpr uint32_t kPeekMask = kDecodeTableSize - 1;
constexpr int kCodesPerWindow = 33 / kMaxCodeLen;  // 3

// A lane's slice of a Huffman stream: the codes that start in [start, end).
struct Slice {
  uint32_t n;     // codes decoded
  uint32_t next;  // where the code after them starts (kDead: after an invalid code, or too many)
  uint32_t flag;  // 0; 1: an invalid code after the n; 2: more codes than a valid segment has
};
__device__ inline Slice decode_slice(const uint32_t* stage, const uint16_t* table, uint32_t start, uint32_t end,
                                     uint32_t max_codes) {
  if (start == kDead) return Slice{0, kDead, 0};
  uint32_t pos = start, n = 0;
  while (pos < end) {
    uint64_t w = window(stage, pos);
    DQ_UNROLL
    for (int j = 0; j < kCodesPerWindow; ++j) {
      const uint32_t l = table[uint32_t(w) & kPeekMask] >> 8;
      if (l == 0) return Slice{n, kDead, 1};
      ++n;
      pos += l;
      w >>= l;
      if (pos >= end) break;
    }
    if (n > max_codes) return Slice{n, kDead, 2};
  }
  return Slice{n, pos, 0};
}

// Huffman segment of `count` symbols whose stream (`bytes` long; `avail`
// readable from seg) decodes, by the same rule as huff_decode_segment: every
// one of the first `count` codes valid and they end in the stream's last byte.
//
// In parallel: the stream's bits are cut into 32 slices; lane l decodes the
// codes that start in slice l, from a guessed start (the slice's first bit;
// lane 0's is exact). A lane's true start is where the codes of the lane
// before end, so each round every lane whose start differs from its left
// neighbour's end takes that end and decodes again; after round r the first
// r + 1 slices are exact, so at most 32 rounds; on gradient streams (codes
// resynchronise within a few codes) mostly 2 (the README's counts). Then the
// codes per slice are scanned, and each lane writes its symbols at its offset.
__device__ bool huff_segment_warp(const uint8_t* seg, uint32_t bytes, uint64_t avail, int count,
                                  const uint16_t* table, uint32_t* stage, uint8_t* out, uint8_t* exps) {
  const int lane = lane_id();
  if (bytes > uint32_t((count * kMaxCodeLen + 7) / 8)) return false;  // uniform: longer than any valid stream
  const uint32_t words = (bytes + 8 + 3) / 4 + 1;
  for (uint32_t w = lane; w < words; w += kWarp) {
    uint32_t v = 0;
    for (uint32_t b = 0; b < 4; ++b) {
      const uint32_t i = 4 * w + b;
      if (i < bytes + 8 && i < avail) v |= uint32_t(seg[i]) << (8 * b);
    }
    stage[w] = v;
  }
  __syncwarp();
  const uint32_t bits = 8 * bytes, per = (bits + kWarp - 1) / kWarp;
  const uint32_t first = umin(lane * per, bits), end = umin(first + per, bits);
  const uint32_t max_codes = uint32_t(count) + 7;  // a valid stream's padding holds at most 7 codes
  uint32_t start = first;
  Slice sl = decode_slice(stage, table, start, end, max_codes);
  for (;;) {
    uint32_t want = __shfl_up_sync(kFullMask, sl.next, 1);
    if (lane == 0) want = 0;
    const bool moved = want != start;
    if (__ballot_sync(kFullMask, moved) == 0) break;
    if (moved) {
      start = want;
      sl = decode_slice(stage, table, start, end, max_codes);
    }
  }
  const uint32_t incl = warp_inclusive_sum(sl.n), off = incl - sl.n;
  const uint32_t total = __shfl_sync(kFullMask, incl, kWarp - 1);
  const unsigned flagged = __ballot_sync(kFullMask, sl.flag != 0);
  bool ok = total >= uint32_t(count);
  if (flagged) {  // the first stop decides: an invalid code among the first `count`, or too many codes
    const int fl = ffs32(flagged) - 1;
    const uint32_t flag = __shfl_sync(kFullMask, sl.flag, fl), at = __shfl_sync(kFullMask, incl, fl);
    if (flag == 2 || at < uint32_t(count)) ok = false;
  }
  if (!ok) return false;  // uniform
  const uint32_t lim = off < uint32_t(count) ? umin(sl.n, uint32_t(count) - off) : 0;
  uint32_t pos = start;
  for (uint32_t i = 0; i < lim;) {
    uint64_t w = window(stage, pos);
    DQ_UNROLL
    for (int j = 0; j < kCodesPerWindow; ++j, ++i) {
      if (i >= lim) break;
      const uint32_t e = table[uint32_t(w) & kPeekMask];
      out[off + i] = uint8_t(e);
      pos += e >> 8;
      w >>= e >> 8;
    }
  }
  const unsigned owner = __ballot_sync(kFullMask, lim > 0 && off + lim == uint32_t(count));
  const uint32_t stop = __shfl_sync(kFullMask, pos, ffs32(owner) - 1);
  __syncwarp();
  for (int i = lane; i < count / 8; i += kWarp) stv(exps + 8 * i, ldv<uint64_t>(out + 8 * i));
  return (stop + 7) / 8 == bytes;
}

// The body exponents of a parsed section into exps: warp w of block b decodes
// segment 8b + w. Nothing for const and for a plain section the merge reads
// in place, or if the parse refused the message.
__global__ void __launch_bounds__(kSegThreads)
    section_kernel(DType dtype, LosslessDevicePlan* P, const uint8_t* sec, int64_t body, int64_t G, int64_t S,
                   const uint32_t* start, const uint16_t* table_g, uint8_t* exps) {
  __shared__ uint16_t table[kDecodeTableSize];
  __shared__ uint32_t stage[kSegWarps][kStageWords];
  __shared__ __align__(16) uint8_t out[kSegWarps][kSegment];
  __shared__ uint8_t ztab[8];
  if (P->fault.kind != FaultKind::kNone) return;  // uniform
  const ExpFormat fmt = ExpFormat(P->format);
  const bool zip = fmt == ExpFormat::kZip;
  const int tid = int(threadIdx.x), warp = tid / kWarp;
  if (fmt == ExpFormat::kPlain && !plain_in_place(dtype, fmt, sec)) {  // uniform
    // fp16's 5 bit planes, or bf16 / float32 bytes at an unaligned address: a lane's 4 groups
    const int64_t s = int64_t(blockIdx.x) * kSegWarps + warp;
    const int64_t g0 = s * (kSegment / kGroup) + 4 * lane_id();
    for (int64_t g = g0; g < g0 + 4 && g < G; ++g) {
      uint64_t ex = 0;
      if (dtype == DType::kF16)
        for (int k = 0; k < 5; ++k) ex |= unpack_plane(sec[k * G + g]) << k;
      else
        ex = load_u64(sec + 8 * g);
      stv(exps + 8 * g, ex);
    }
    return;
  }
  if (!zip && fmt != ExpFormat::kHuffman) return;
  if (zip && tid < 8) ztab[tid] = P->zip_table[tid];
  if (!zip)
    for (int j = tid; j < kDecodeTableSize; j += kSegThreads) table[j] = table_g[j];
  __syncthreads();
  const int64_t s = int64_t(blockIdx.x) * kSegWarps + warp;
  if (s >= S) return;  // uniform in the warp
  const uint32_t b = start[s], e = start[s + 1];
  const bool ok = zip ? zip_segment_warp(sec + P->planes_offset, sec + P->payload_offset, G, body, s, b, e, ztab, exps)
                      : huff_segment_warp(sec + P->payload_offset + b, e - b, uint64_t(P->payload_bytes) - b,
                                          segment_count(body, s), table, stage[warp], out[warp], exps + s * kSegment);
  if (!ok && lane_id() == 0) atomicExch(&P->codes_bad, 1);
}

// ---- 3. merge ---------------------------------------------------------------------------

// Group g's 8 values from its exponents ex (byte j: value j's) and the SM planes (sm = message + 16).
// kVec: sm and v 16-byte aligned (one or two 16-byte stores); else value by value. The fields
// are Split<T>::merge's, two 16-bit values per 32-bit word (byte permutes place their bytes).
template <DType T, bool kVec>
__device__ inline void merge_words(uint64_t ex, const uint8_t* sm, int64_t g, int64_t G, typename Split<T>::word* v) {
  uint4 a, b;  // the values' words: a (16-bit dtypes), a and b (float32)
  if constexpr (T == DType::kF32) {
    uint4 lo;
    uint64_t hi;
    if constexpr (kVec) {
      lo = ldv<uint4>(sm + 16 * g);
      hi = ldv<uint64_t>(sm + 16 * G + 8 * g);
    } else {
      lo.x = load_u32(sm + 16 * g), lo.y = load_u32(sm + 16 * g + 4), lo.z = load_u32(sm + 16 * g + 8),
      lo.w = load_u32(sm + 16 * g + 12);
      hi = load_u64(sm + 16 * G + 8 * g);
    }
    // value j: its mantissa[15:0] (half j % 2 of lo word j / 2), byte j of hi twice above
    // them (sign from the upper copy, mantissa[22:16] from the lower), its exponent at bit 23
    const auto value = [&](int j) {
      const uint32_t lw = j < 2 ? lo.x : j < 4 ? lo.y : j < 6 ? lo.z : lo.w;
      const uint32_t hw = uint32_t(hi >> (32 * (j / 4))), ew = uint32_t(ex >> (32 * (j / 4)));
      const uint32_t sel = (j % 2 ? 0x32u : 0x10u) | (0x44u + uint32_t(j % 4) * 0x11u) << 8;
      return (__byte_perm(lw, hw, sel) & 0x807fffffu) | (__byte_perm(ew, 0, 0x4440u | uint32_t(j % 4)) << 23);
    };
    a.x = value(0), a.y = value(1), a.z = value(2), a.w = value(3);
    b.x = value(4), b.y = value(5), b.z = value(6), b.w = value(7);
  } else {
    const uint64_t lo = kVec ? ldv<uint64_t>(sm + 8 * g) : load_u64(sm + 8 * g);
    uint64_t hi3 = 0;
    if constexpr (T == DType::kF16)
      hi3 = unpack_plane(sm[8 * G + g]) | (unpack_plane(sm[9 * G + g]) << 1) | (unpack_plane(sm[10 * G + g]) << 2);
    // bytes 2i and 2i + 1 of x at bytes 0 and 2 (values 2i and 2i + 1 of word i)
    const auto pair = [](uint64_t x, int i) {
      return __byte_perm(uint32_t(x >> (32 * (i / 2))), 0, i % 2 ? 0x4342u : 0x4140u);
    };
    const auto word = [&](int i) {
      const uint32_t e = pair(ex, i), l = pair(lo, i);
      if constexpr (T == DType::kBF16) return ((l & 0x00800080u) << 8) | (e << 7) | (l & 0x007f007fu);
      const uint32_t h = pair(hi3, i);
      return ((h & 0x00040004u) << 13) | (e << 10) | ((h & 0x00030003u) << 8) | l;
    };
    a.x = word(0), a.y = word(1), a.z = word(2), a.w = word(3);
  }
  if constexpr (kVec) {
    stv(v + 8 * g, a);
    if constexpr (T == DType::kF32) stv(v + 8 * g + 4, b);
  } else if constexpr (T == DType::kF32) {
    const uint32_t u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    DQ_UNROLL
    for (int j = 0; j < 8; ++j) v[8 * g + j] = u[j];
  } else {
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
    DQ_UNROLL
    for (int j = 0; j < 8; ++j) v[8 * g + j] = uint16_t(w[j / 2] >> (16 * (j % 2)));
  }
}

// values <- the SM planes and tail merged with the exponents; if the message
// was refused, nothing, and thread 0 records the refusal in *first (if empty).
template <DType T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const LosslessDevicePlan* P, const uint8_t* msg, Layout L, const uint8_t* __restrict__ exps,
                 typename Split<T>::word* v, Fault* first) {
  using W = typename Split<T>::word;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  Fault f = P->fault;
  if (f.kind == FaultKind::kNone && P->codes_bad) {
    const int32_t dt = f.dtype;
    f = fault(FaultKind::kCodes);
    f.dtype = dt;
  }
  if (f.kind != FaultKind::kNone) {
    if (i == 0 && atomicCAS(reinterpret_cast<int32_t*>(&first->kind), 0, int32_t(f.kind)) == 0) {
      first->dtype = f.dtype;
      first->a = f.a;
      first->b = f.b;
    }
    return;
  }
  // the exponents: const's byte, or 8 bytes per group from exps (the section kernel's) or,
  // for a bf16 / float32 plain section at an 8-byte aligned address, from the section itself
  // (const: the parse's 8 copies of the exponent, read for every group)
  const int64_t G = L.groups;
  const ExpFormat fmt = ExpFormat(P->format);
  const uint8_t* sec = msg + L.static_bytes;
  const bool cst = fmt == ExpFormat::kConst;
  const uint8_t* src = cst ? reinterpret_cast<const uint8_t*>(&P->const_exps) : plain_in_place(T, fmt, sec) ? sec : exps;
  const int64_t step = cst ? 0 : 8;
  constexpr int R = kMergeGroups<T>;
  DQ_UNROLL
  for (int r = 0; r < R; ++r) {
    const int64_t g = int64_t(blockIdx.x) * (R * kThreads) + r * kThreads + threadIdx.x;
    if (g >= G) break;
    const uint64_t ex = ldv<uint64_t>(src + step * g);
    merge_words<T, kVec>(ex, msg + kHeaderBytes, g, G, v);
  }
  if (i < L.tail) {
    W w;
    memcpy(&w, msg + L.tail_offset + i * int64_t(sizeof(W)), sizeof(W));
    v[L.body + i] = w;
  }
}

}  // namespace

void lossless_decode_cuda(DType dtype, const uint8_t* msg, size_t in_bytes, int64_t n, void* values,
                          const LosslessDecodeScratch& sc, cudaStream_t stream) {
  const Layout L = make_layout(dtype, n);
  DQ_LAUNCH(parse_kernel, 1, kParseThreads, 0, stream)(dtype, msg, uint64_t(in_bytes), n, sc.plan, sc.seg_start,
                                                        sc.table);
  check(cudaGetLastError(), "parse kernel");
  if (L.segments) {
    const unsigned grid = unsigned((L.segments + kSegWarps - 1) / kSegWarps);
    DQ_LAUNCH(section_kernel, grid, kSegThreads, 0, stream)(dtype, sc.plan, msg + L.static_bytes, L.body, L.groups,
                                                            L.segments, sc.seg_start, sc.table, sc.exps);
    check(cudaGetLastError(), "section kernel");
  }
  const bool vec = aligned16(msg) && aligned16(values);
  DQ_DISPATCH_DTYPE(dtype, T, [&] {
    using W = typename Split<T>::word;
    const int64_t per_block = int64_t(kMergeGroups<T>) * kThreads;
    const int64_t blocks = (L.groups + per_block - 1) / per_block;
    const unsigned grid = unsigned(blocks > 0 ? blocks : 1);  // (the tail, < 8 values: block 0)
    if (vec)
      DQ_LAUNCH((merge_kernel<T, true>), grid, kThreads, 0, stream)(sc.plan, msg, L, sc.exps, static_cast<W*>(values),
                                                                    sc.fault);
    else
      DQ_LAUNCH((merge_kernel<T, false>), grid, kThreads, 0, stream)(sc.plan, msg, L, sc.exps,
                                                                     static_cast<W*>(values), sc.fault);
    check(cudaGetLastError(), "merge kernel");
  });
}

}  // namespace dynamiq
