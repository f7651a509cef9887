// The GPU encode's format choice: lossless_plan_encode (lossless_codec.cc)
// done on the device by one block, so that the encode needs no host wait
// before its section is written. Every choice is the host's, bit for bit: the
// same candidates (plain, const, zip, Huffman), sizes and ties; zip's seven
// codes by (frequency descending, exponent ascending); Huffman's code lengths
// by the same package-merge as lossless_code_lengths (stable sort by
// frequency, a leaf before a package of equal weight, the first 2k - 2 items
// of the last list), in parallel: each leaf and package finds its place in a
// level's merged list by a binary search in the other list, ~8 steps, so the
// 10 levels cost about 10 barriers, not the ~k * 11 serial steps of the host
// loop. tests/cpp/cuda_lossless_plan.cu compares the two on histograms that
// reach the length limit, tie everywhere, or hold 2 or 256 exponents.
#include <cuda_runtime.h>

#include "kernels/base/cuda/launch.h"
#include "kernels/lossless/cuda/lossless_device.h"
#include "kernels/lossless/lossless_validate.h"

namespace dynamiq {
namespace {

using namespace lossless;
using namespace lossless_dev;

constexpr int kPlanThreads = 256;  // thread e looks after exponent e
constexpr int kMaxItems = 2 * 256;  // a package-merge list: k leaves + fewer than k packages

// Shared memory of the package-merge (plan_kernel's, passed in).
struct MergeLists {
  unsigned long long w[2][kMaxItems];          // the weights of levels t - 1 and t (alternating)
  uint32_t pkg[kMaxCodeLen][kMaxItems / 32];   // bit j of level t: item j of list t is a package
  uint32_t leaf[256];                          // leaf weights, ascending (stable)
  uint8_t by_weight[256];                      // position -> symbol index
  int leaves[kMaxCodeLen];                     // level t: leaves among the selected items
};

// len[i] <- the code length of symbol i (freq[i] > 0, i < k, 2 <= k <= 256):
// lossless_code_lengths(freq, k, kMaxCodeLen, len). Every thread calls it.
__device__ void code_lengths(int k, const uint32_t* freq, MergeLists& s, uint8_t* len) {
  const int t = int(threadIdx.x);
  if (t < k) {  // stable sort by frequency: t's position
    const uint32_t f = freq[t];
    int pos = 0;
    for (int j = 0; j < k; ++j) pos += freq[j] < f || (freq[j] == f && j < t);
    s.by_weight[pos] = uint8_t(t);
    s.leaf[pos] = f;
    s.w[0][pos] = f;  // level 0: the leaves
  }
  for (int j = t; j < kMaxCodeLen * (kMaxItems / 32); j += kPlanThreads) s.pkg[j / (kMaxItems / 32)][j % (kMaxItems / 32)] = 0;
  __syncthreads();
  int size = k;  // items in list t - 1
  for (int lvl = 1; lvl < kMaxCodeLen; ++lvl) {
    const unsigned long long* prev = s.w[(lvl - 1) & 1];
    unsigned long long* cur = s.w[lvl & 1];
    const int np = size / 2;  // packages: pairs of list t - 1's items
    if (t < k) {  // leaf t follows the packages lighter than it
      const unsigned long long w = s.leaf[t];
      int lo = 0, hi = np;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (prev[2 * mid] + prev[2 * mid + 1] < w) lo = mid + 1;
        else hi = mid;
      }
      cur[t + lo] = w;
    }
    if (t < np) {  // package t follows the leaves no heavier than it
      const unsigned long long w = prev[2 * t] + prev[2 * t + 1];
      int lo = 0, hi = k;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (s.leaf[mid] <= w) lo = mid + 1;
        else hi = mid;
      }
      cur[t + lo] = w;
      atomicOr(&s.pkg[lvl][(t + lo) / 32], 1u << ((t + lo) % 32));
    }
    size = k + np;
    __syncthreads();
  }
  if (t == 0) {
    // The first 2k - 2 items of the last list are selected; the packages among
    // a level's selected items select the first two items per package of the
    // level below. A leaf's length is the number of levels that select it.
    int c = 2 * k - 2;
    for (int lvl = kMaxCodeLen - 1; lvl >= 1; --lvl) {
      int pk = 0;
      for (int j = 0; j < c / 32; ++j) pk += popc32(s.pkg[lvl][j]);
      if (c % 32) pk += popc32(s.pkg[lvl][c / 32] & ((1u << (c % 32)) - 1u));
      s.leaves[lvl] = c - pk;
      c = 2 * pk;
    }
    s.leaves[0] = c;
  }
  __syncthreads();
  if (t < k) {
    int l = 0;
    for (int lvl = 0; lvl < kMaxCodeLen; ++lvl) l += t < s.leaves[lvl];
    len[s.by_weight[t]] = uint8_t(l);
  }
  __syncthreads();
}

// One block of kPlanThreads: reads and clears st->hist, chooses the format as
// lossless_plan_encode does, writes the choice and the encoders' tables to *st
// and the section's table (zip, Huffman) or byte (const) to the message.
__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(uint8_t dtype, int64_t n, uint32_t formats, LosslessEncodeState* st, uint8_t* msg) {
  __shared__ MergeLists lists;
  __shared__ uint32_t freq[256];  // of the i-th smallest exponent present
  __shared__ uint8_t sym[256];
  __shared__ uint8_t len[256];
  __shared__ uint8_t top[kZipCodes];
  __shared__ int counts[kPlanThreads / kWarp];
  __shared__ uint32_t len_count[kMaxCodeLen + 1], next_code[kMaxCodeLen + 1];
  __shared__ unsigned long long covered, bits;

  const int e = int(threadIdx.x);
  const Layout L = make_layout(DType(dtype), n);
  const int64_t m = L.body;
  const uint32_t h = st->hist[e];
  st->hist[e] = 0;  // ready for the next encode
  int k = 0;
  const int i = block_rank(h != 0, counts, &k);  // e is the i-th exponent present
  if (h) {
    sym[i] = uint8_t(e);
    freq[i] = h;
  }
  if (e < kZipCodes) top[e] = 0;
  if (e <= kMaxCodeLen) len_count[e] = 0;
  if (e == 0) covered = bits = 0;
  __syncthreads();

  int64_t best = L.plain_bytes;
  ExpFormat f = ExpFormat::kPlain;
  if (m > 0 && k == 1 && (formats & (1u << int(ExpFormat::kConst))) && 1 < best) best = 1, f = ExpFormat::kConst;
  int zip_rank = kZipCodes;
  if (m > 0 && (formats & (1u << int(ExpFormat::kZip)))) {  // uniform
    if (h) {  // the 7 most frequent exponents, ties to the smaller one
      int r = 0;
      for (int j = 0; j < k; ++j) r += freq[j] > h || (freq[j] == h && j < i);
      zip_rank = r;
      if (r < kZipCodes) {
        top[r] = uint8_t(e);
        atomicAdd(&covered, (unsigned long long)h);
      }
    }
    __syncthreads();
    const int64_t z = zip_section_bytes(L, m - int64_t(covered));
    if (z < best) best = z, f = ExpFormat::kZip;
  }
  if (m > 0 && k >= 2 && (formats & (1u << int(ExpFormat::kHuffman)))) {  // uniform
    code_lengths(k, freq, lists, len);
    if (h) {
      atomicAdd(&bits, (unsigned long long)h * len[i]);
      atomicAdd(&len_count[len[i]], 1u);
    }
    __syncthreads();
    // byte alignment adds < 1 byte per segment: a bound, exact once encoded
    const int64_t hb = huff_header_bytes(L, k) + int64_t((bits + 7 * uint64_t(L.segments)) / 8);
    if (hb < best) best = hb, f = ExpFormat::kHuffman;
  }

  uint8_t* sec = msg + L.static_bytes;
  if (f == ExpFormat::kConst && e == 0) sec[0] = sym[0];
  st->code_of[e] = f == ExpFormat::kZip && zip_rank < kZipCodes ? uint8_t(zip_rank + 1) : 0;
  if (f == ExpFormat::kZip && e < kZipTableBytes) sec[e] = e < kZipCodes ? top[e] : 0;
  uint32_t code = 0;
  if (f == ExpFormat::kHuffman) {  // uniform: canonical codes, as huff_reversed_codes
    if (e == 0) {
      uint32_t c = 0;
      next_code[0] = 0;
      for (int l = 1; l <= kMaxCodeLen; ++l) {
        c = (c + len_count[l - 1]) << 1;
        next_code[l] = c;
      }
    }
    __syncthreads();
    if (h) {
      const int l = len[i];
      uint32_t c = next_code[l];
      for (int j = 0; j < i; ++j) c += len[j] == l;
      code = reverse_bits(c, l) | uint32_t(l) << 16;
      sec[1 + i] = uint8_t(e);
    }
    if (e == 0) sec[0] = uint8_t(k - 1);
    if (e < (k + 1) / 2) sec[1 + k + e] = uint8_t(len[2 * e] | (2 * e + 1 < k ? len[2 * e + 1] << 4 : 0));
  }
  st->huff[e] = code;
  if (e == 0) {
    st->format = uint32_t(f);
    st->prefix_bytes = f == ExpFormat::kZip ? kZipTableBytes : f == ExpFormat::kHuffman ? 1 + k + (k + 1) / 2 : 0;
    st->bound = best;
  }
}

}  // namespace

void lossless_plan_cuda(DType dtype, int64_t n, uint32_t formats, LosslessEncodeState* st, uint8_t* msg,
                        cudaStream_t stream) {
  DQ_LAUNCH(plan_kernel, 1, kPlanThreads, 0, stream)(uint8_t(dtype), n, formats, st, msg);
}

}  // namespace dynamiq
