// The lossless codec's host-side planning and statistics (lossless_codec.h):
// package-merge code lengths, the encoder's format choice and tables
// (lossless_plan_encode, which the CUDA plan kernel reproduces on the device),
// the header writer, and the per-tensor statistics. The CPU loops that encode
// and decode with these plans, and the codec, are in lossless_codec.cc.
#include "kernels/lossless/lossless_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace dynamiq {

using namespace lossless;

// ---- package-merge --------------------------------------------------------------

void lossless_code_lengths(const uint64_t* freq, int k, int maxlen, uint8_t* len) {
  DQ_CHECK(k >= 2 && k <= 256, "code lengths: need 2..256 symbols");
  DQ_CHECK(maxlen >= 1 && maxlen <= 15 && (1 << maxlen) >= k, "code lengths: maxlen too small");
  std::vector<int> order(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return freq[a] < freq[b]; });
  // An item is a leaf (>= 0: position in `order`) or a package (< 0: -1 - index
  // of its first child in the previous level's list; children are 2p, 2p+1).
  struct Item {
    uint64_t w;
    int ref;
  };
  std::vector<std::vector<Item>> lists(static_cast<size_t>(maxlen));
  for (int i = 0; i < k; ++i) lists[0].push_back({freq[order[size_t(i)]], i});
  for (int t = 1; t < maxlen; ++t) {
    const auto& prev = lists[size_t(t - 1)];
    auto& cur = lists[size_t(t)];
    size_t a = 0, p = 0;
    const size_t np = prev.size() / 2;
    while (a < size_t(k) || p < np) {
      const bool take_leaf =
          p >= np || (a < size_t(k) && freq[order[a]] <= prev[2 * p].w + prev[2 * p + 1].w);
      if (take_leaf) {
        cur.push_back({freq[order[a]], int(a)});
        ++a;
      } else {
        cur.push_back({prev[2 * p].w + prev[2 * p + 1].w, -1 - int(2 * p)});
        ++p;
      }
    }
  }
  std::vector<int> depth(static_cast<size_t>(k), 0);
  // Count leaf occurrences under the first 2k-2 items of the last list.
  std::vector<std::pair<int, int>> stack;  // (level, index)
  for (int i = 0; i < 2 * k - 2; ++i) stack.push_back({maxlen - 1, i});
  while (!stack.empty()) {
    auto [t, i] = stack.back();
    stack.pop_back();
    const Item& it = lists[size_t(t)][size_t(i)];
    if (it.ref >= 0) {
      ++depth[size_t(it.ref)];
    } else {
      const int c = -1 - it.ref;
      stack.push_back({t - 1, c});
      stack.push_back({t - 1, c + 1});
    }
  }
  for (int i = 0; i < k; ++i) len[order[size_t(i)]] = uint8_t(depth[size_t(i)]);
}

// ---- host plans ---------------------------------------------------------------------

void lossless_plan_encode(DType dtype, int64_t n, const uint64_t* hist, const LosslessOptions& opt,
                          LosslessEncodePlan& p) {
  lossless_check_count(n);
  const Layout L = make_layout(dtype, n);
  const int64_t m = L.body;
  p.layout = L;
  p.format = ExpFormat::kPlain;
  p.k = 0;
  p.n_esc = 0;
  p.prefix_bytes = 0;
  p.entropy_bits = 0.0;
  std::memset(p.zip_code_of, 0, sizeof(p.zip_code_of));
  std::memset(p.huff_code, 0, sizeof(p.huff_code));
  std::memset(p.huff_len, 0, sizeof(p.huff_len));
  int64_t best = L.plain_bytes;
  p.section_bytes = best;
  for (int f = 0; f < kNumFormats; ++f) p.candidate_bytes[f] = -1;
  p.candidate_bytes[int(ExpFormat::kPlain)] = L.plain_bytes;
  if (m == 0) return;
  uint64_t total = 0;
  for (int s = 0; s < 256; ++s)
    if (hist[s]) {
      if (s >= exp_alphabet(dtype)) throw Error("lossless: exponent histogram out of range");
      p.syms[p.k] = uint8_t(s);
      p.freq[p.k] = hist[s];
      ++p.k;
      total += hist[s];
      p.entropy_bits -= double(hist[s]) * std::log2(double(hist[s]) / double(m));
    }
  if (total != uint64_t(m)) throw Error("lossless: exponent histogram does not sum to the block's body");
  const bool allow_const = opt.formats & (1u << int(ExpFormat::kConst));
  const bool allow_zip = opt.formats & (1u << int(ExpFormat::kZip));
  const bool allow_huff = opt.formats & (1u << int(ExpFormat::kHuffman));
  ExpFormat f = ExpFormat::kPlain;
  if (p.k == 1 && allow_const) {
    p.candidate_bytes[int(ExpFormat::kConst)] = 1;
    if (1 < best) best = 1, f = ExpFormat::kConst;
  }
  uint8_t top[kZipCodes] = {0, 0, 0, 0, 0, 0, 0};
  if (allow_zip) {
    // The 7 most frequent exponents (ties: smaller exponent first).
    int idx[256];
    for (int i = 0; i < p.k; ++i) idx[i] = i;
    const int t = std::min(p.k, kZipCodes);
    std::partial_sort(idx, idx + t, idx + p.k, [&](int a, int b) {
      return p.freq[a] != p.freq[b] ? p.freq[a] > p.freq[b] : a < b;
    });
    uint64_t covered = 0;
    for (int i = 0; i < t; ++i) {
      top[i] = p.syms[idx[i]];
      covered += p.freq[idx[i]];
    }
    const int64_t z = zip_section_bytes(L, m - int64_t(covered));
    p.candidate_bytes[int(ExpFormat::kZip)] = z;
    if (z < best) {
      best = z, f = ExpFormat::kZip;
      p.n_esc = m - int64_t(covered);
      for (int i = 0; i < t; ++i) p.zip_code_of[top[i]] = uint8_t(i + 1);
    }
  }
  uint8_t lens[256] = {};
  if (allow_huff && p.k >= 2) {
    lossless_code_lengths(p.freq, p.k, kMaxCodeLen, lens);
    uint64_t bits = 0;
    for (int i = 0; i < p.k; ++i) bits += p.freq[i] * lens[i];
    // Byte alignment adds < 1 byte per segment: an upper bound, exact after encoding.
    const int64_t h = huff_header_bytes(L, p.k) + int64_t((bits + 7 * uint64_t(L.segments)) / 8);
    p.candidate_bytes[int(ExpFormat::kHuffman)] = h;
    if (h < best) best = h, f = ExpFormat::kHuffman;
  }
  p.format = f;
  p.section_bytes = best;
  if (f == ExpFormat::kZip) {
    std::memcpy(p.prefix, top, kZipCodes);
    p.prefix[kZipCodes] = 0;
    p.prefix_bytes = kZipTableBytes;
  } else if (f == ExpFormat::kHuffman) {
    const int k = p.k;
    p.prefix[0] = uint8_t(k - 1);
    std::memcpy(p.prefix + 1, p.syms, size_t(k));
    uint8_t* nib = p.prefix + 1 + k;
    std::memset(nib, 0, size_t((k + 1) / 2));
    for (int i = 0; i < k; ++i) nib[i / 2] |= uint8_t(lens[i] << (4 * (i & 1)));
    p.prefix_bytes = 1 + k + (k + 1) / 2;
    huff_build_tables(k, p.syms, lens, nullptr, p.huff_code, p.huff_len);
  }
}

void lossless_write_header(uint8_t* out, DType dtype, int64_t n, ExpFormat format, uint32_t dynamic_bytes) {
  lossless_check_count(n);
  write_header(out, uint8_t(dtype), uint32_t(n), uint8_t(format), dynamic_bytes);
}

// ---- statistics -----------------------------------------------------------------------

LosslessStats lossless_stats(const void* data, DType dtype, int64_t numel, int64_t block_bytes,
                             const LosslessOptions& opt) {
  DQ_CHECK(numel >= 0, "lossless_stats: numel must be >= 0");
  DQ_CHECK(numel == 0 || data != nullptr, "lossless_stats: null data");
  LosslessStats st;
  st.dtype = dtype;
  st.numel = numel;
  const int64_t es = dtype_size(dtype);
  st.raw_bytes = numel * es;
  if (numel == 0) return st;
  DQ_CHECK(block_bytes > 0, "lossless_stats: block_bytes must be positive");
  // Blocks as the collective cuts one chunk: units of 256 values, about block_bytes raw each.
  const int64_t unit = 256;
  const int64_t units = ceil_div<int64_t>(numel, unit);
  const int64_t per_block = std::max<int64_t>(1, block_bytes / (unit * es));
  std::vector<uint8_t> msg;
  uint64_t hist_all[256] = {0};
  double block_entropy = 0.0;
  for (int64_t u0 = 0; u0 < units; u0 += per_block) {
    const int64_t e0 = u0 * unit;
    const int64_t n = std::min(numel, (u0 + per_block) * unit) - e0;
    msg.resize(lossless_static_bytes(dtype, n) + lossless_max_dynamic_bytes(dtype, n));
    LosslessBlockInfo info;
    const size_t bytes =
        lossless_encode(static_cast<const uint8_t*>(data) + e0 * es, dtype, n, msg.data(), opt, &info);
    st.blocks += 1;
    st.coded_bytes += int64_t(bytes);
    st.exponent_bytes += info.dynamic_bytes;
    st.body_exponents += info.body;
    st.blocks_by_format[int(info.format)] += 1;
    block_entropy += info.entropy_bits;
    // Exponents of the whole block (tail included) for the tensor's entropy.
    DQ_DISPATCH_DTYPE(dtype, T, [&] {
      using S = Split<T>;
      const auto* v = reinterpret_cast<const typename S::word*>(static_cast<const uint8_t*>(data) + e0 * es);
      for (int64_t i = 0; i < n; ++i) ++hist_all[S::exponent(v[i])];
    });
  }
  double h = 0.0;
  for (int s = 0; s < 256; ++s)
    if (hist_all[s]) h -= double(hist_all[s]) * std::log2(double(hist_all[s]) / double(numel));
  st.exponent_entropy = h / double(numel);
  st.block_exponent_entropy = st.body_exponents ? block_entropy / double(st.body_exponents) : 0.0;
  st.exponent_bits = st.body_exponents ? 8.0 * double(st.exponent_bytes) / double(st.body_exponents) : 0.0;
  st.ratio = double(st.coded_bytes) / double(st.raw_bytes);
  return st;
}

double zipccl_sigma_rule_bits(const void* data, DType dtype, int64_t numel) {
  if (numel <= 0) return 0.0;
  double ss = 0.0, sum = 0.0;
  uint64_t hist[256] = {0};
  DQ_DISPATCH_DTYPE(dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    using S = Split<T>;
    const auto* p = static_cast<const typename Tr::storage*>(data);
    const auto* w = static_cast<const typename S::word*>(data);
    for (int64_t i = 0; i < numel; ++i) {
      const double v = Tr::load(p, i);
      if (std::isfinite(v)) sum += v, ss += v * v;
      ++hist[S::exponent(w[i])];
    }
  });
  const double mean = sum / double(numel);
  const double sigma = std::sqrt(std::max(0.0, ss / double(numel) - mean * mean));
  const int bias = dtype == DType::kF16 ? 15 : 127;
  const int alphabet = exp_alphabet(dtype);
  int x0 = sigma > 0 ? int(std::floor(std::log2(sigma) - 5.35 + 0.5)) + bias : 0;
  uint64_t covered = 0;
  for (int e = x0; e < x0 + kZipCodes; ++e)
    if (e >= 0 && e < alphabet) covered += hist[e];
  const double esc = double(numel - int64_t(covered)) / double(numel);
  return 3.0 + exp_bits(dtype) * esc;
}

}  // namespace dynamiq
