// The lossless codec on its own: bit-exact round trips on adversarial data in
// every exponent format, the byte accounting against an independent count,
// the raw fallback bound, Huffman code optimality against brute force, the
// identity codec's arithmetic reproduced bit for bit, and malformed messages
// rejected with MalformedMessage (run these under AddressSanitizer too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {
namespace {

using lossless::ExpFormat;

constexpr uint32_t kPlainOnly = 1u << 0;
constexpr uint32_t kConstOnly = kPlainOnly | (1u << 1);
constexpr uint32_t kZipOnly = kPlainOnly | (1u << 2);
constexpr uint32_t kHuffOnly = kPlainOnly | (1u << 3);
constexpr uint32_t kAll = 0xf;

int esize(DType t) { return dtype_size(t); }

// A tensor as raw bytes in its dtype.
struct Tensor {
  DType dtype;
  std::vector<uint8_t> bytes;
  int64_t n() const { return int64_t(bytes.size()) / esize(dtype); }
  uint32_t word(int64_t i) const {
    uint32_t w = 0;
    std::memcpy(&w, bytes.data() + i * esize(dtype), size_t(esize(dtype)));
    return w;
  }
  void set(int64_t i, uint32_t w) { std::memcpy(bytes.data() + i * esize(dtype), &w, size_t(esize(dtype))); }
};

Tensor make(DType t, int64_t n) { return Tensor{t, std::vector<uint8_t>(size_t(n * esize(t)), 0)}; }

uint32_t from_float(DType t, float f) {
  if (t == DType::kF32) return f32_bits(f);
  return t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
}

Tensor gaussian(DType t, int64_t n, float sigma, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, sigma);
  Tensor x = make(t, n);
  for (int64_t i = 0; i < n; ++i) x.set(i, from_float(t, d(g)));
  return x;
}

// Exponent field of a word (independent of the codec's Split traits).
int exponent_of(DType t, uint32_t w) {
  if (t == DType::kF32) return int((w >> 23) & 0xff);
  if (t == DType::kBF16) return int((w >> 7) & 0xff);
  return int((w >> 10) & 0x1f);
}

struct Coded {
  std::vector<uint8_t> msg;
  LosslessBlockInfo info;
};

Coded encode(const Tensor& x, uint32_t formats = kAll) {
  const int64_t n = x.n();
  Coded c;
  c.msg.assign(lossless_static_bytes(x.dtype, n) + lossless_max_dynamic_bytes(x.dtype, n), 0xcd);
  LosslessOptions opt;
  opt.formats = formats;
  const size_t bytes = lossless_encode(x.bytes.data(), x.dtype, n, c.msg.data(), opt, &c.info);
  c.msg.resize(bytes);
  return c;
}

// Encodes, checks the size accounting and the raw bound, decodes and compares bit for bit.
Coded round_trip(const Tensor& x, uint32_t formats = kAll) {
  const int64_t n = x.n();
  Coded c = encode(x, formats);
  const size_t sb = lossless_static_bytes(x.dtype, n);
  EXPECT_GE(c.msg.size(), sb);
  EXPECT_EQ(c.msg.size(), sb + lossless_dynamic_bytes(c.msg.data(), x.dtype, n));
  EXPECT_LE(c.msg.size() - sb, lossless_max_dynamic_bytes(x.dtype, n));
  // Never more than the raw bytes plus the 16-byte header.
  EXPECT_LE(c.msg.size(), x.bytes.size() + 16);
  std::vector<uint8_t> back(x.bytes.size() + 1, 0x5a);
  lossless_decode(c.msg.data(), c.msg.size(), x.dtype, n, back.data());
  EXPECT_EQ(back[x.bytes.size()], 0x5a) << "decoder wrote past the end";
  back.resize(x.bytes.size());
  if (back != x.bytes) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t w = 0;
      std::memcpy(&w, back.data() + i * esize(x.dtype), size_t(esize(x.dtype)));
      if (w != x.word(i)) {
        ADD_FAILURE() << dtype_name(x.dtype) << " n=" << n << " format "
                      << lossless::exp_format_name(c.info.format) << ": value " << i << " 0x"
                      << std::hex << x.word(i) << " decoded as 0x" << w;
        break;
      }
    }
  }
  return c;
}

// All 2^16 patterns, each followed by `pad` Gaussian values (so the block is
// compressible and the zip/Huffman coders are chosen), in a shuffled order.
Tensor all_patterns_padded(DType t, int pad, uint32_t seed) {
  std::vector<uint32_t> pats(65536);
  std::iota(pats.begin(), pats.end(), 0u);
  std::mt19937 g(seed);
  std::shuffle(pats.begin(), pats.end(), g);
  Tensor gs = gaussian(t, int64_t(65536) * pad, 1e-2f, seed + 1);
  Tensor x = make(t, int64_t(65536) * (pad + 1));
  int64_t k = 0, j = 0;
  for (uint32_t p : pats) {
    x.set(k++, p);
    for (int i = 0; i < pad; ++i) x.set(k++, gs.word(j++));
  }
  return x;
}

TEST(LosslessRoundTrip, Every16BitPatternAsOneBlock) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    Tensor x = make(t, 65536);
    for (uint32_t p = 0; p < 65536; ++p) x.set(p, p);
    for (uint32_t f : {kAll, kPlainOnly, kZipOnly, kHuffOnly}) round_trip(x, f);
    // Uniform over all patterns: every exponent equally frequent, nothing to gain.
    Coded c = encode(x);
    EXPECT_EQ(c.info.format, ExpFormat::kPlain) << dtype_name(t);
    EXPECT_EQ(c.msg.size(), x.bytes.size() + 16) << dtype_name(t);
  }
}

TEST(LosslessRoundTrip, Every16BitPatternThroughEveryCoder) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    const Tensor x = all_patterns_padded(t, 15, 11);
    for (uint32_t f : {kZipOnly, kHuffOnly, kAll}) {
      Coded c = round_trip(x, f);
      // The coder must really have been used (the padding makes it pay).
      const ExpFormat want = f == kZipOnly ? ExpFormat::kZip : ExpFormat::kHuffman;
      EXPECT_EQ(c.info.format, want) << dtype_name(t);
    }
    // And cut into ragged blocks.
    for (int64_t bs : {int64_t(7), int64_t(1001), int64_t(4099)}) {
      for (int64_t b = 0; b < x.n(); b += bs * 37) {  // a sample of blocks
        const int64_t n = std::min(bs, x.n() - b);
        Tensor y{t, std::vector<uint8_t>(x.bytes.begin() + b * 2, x.bytes.begin() + (b + n) * 2)};
        round_trip(y, kAll);
        round_trip(y, kZipOnly);
        round_trip(y, kHuffOnly);
      }
    }
  }
}

TEST(LosslessRoundTrip, RandomF32BitPatterns) {
  std::mt19937 g(5);
  Tensor x = make(DType::kF32, 100003);
  for (int64_t i = 0; i < x.n(); ++i) x.set(i, uint32_t(g()));
  Coded c = round_trip(x);
  // Uniform random words: exponents uniform, the plain fallback, raw + header.
  EXPECT_EQ(c.info.format, ExpFormat::kPlain);
  EXPECT_EQ(c.msg.size(), x.bytes.size() + 16);
  // Random words mixed into Gaussian data go through the coders.
  Tensor y = gaussian(DType::kF32, 100003, 1e-3f, 6);
  for (int64_t i = 0; i < y.n(); i += 13) y.set(i, uint32_t(g()));
  for (uint32_t f : {kAll, kZipOnly, kHuffOnly}) {
    Coded d = round_trip(y, f);
    EXPECT_NE(d.info.format, ExpFormat::kPlain);
  }
}

std::vector<uint32_t> specials(DType t) {
  if (t == DType::kF32)
    return {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
            0x7f800001u, 0x7fbfffffu, 0xffc00001u, 0x7fffffffu, 0xffffffffu, 0x00000001u,
            0x807fffffu, 0x00400000u, 0x7f7fffffu, 0xff7fffffu, 0x00800000u};
  if (t == DType::kBF16)
    return {0x0000u, 0x8000u, 0x7f80u, 0xff80u, 0x7fc0u, 0xffc0u, 0x7f81u, 0x7fbfu,
            0xffc1u, 0x7fffu, 0xffffu, 0x0001u, 0x807fu, 0x0040u, 0x7f7fu, 0x0080u};
  return {0x0000u, 0x8000u, 0x7c00u, 0xfc00u, 0x7e00u, 0xfe00u, 0x7c01u, 0x7dffu,
          0xfe01u, 0x7fffu, 0xffffu, 0x0001u, 0x83ffu, 0x0200u, 0x7bffu, 0x0400u};
}

TEST(LosslessRoundTrip, NanPayloadsZerosInfinitiesDenormals) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const auto sp = specials(t);
    Tensor x = gaussian(t, 20000, 1e-2f, 7);
    std::mt19937 g(8);
    for (int64_t i = 0; i < x.n(); i += 7) x.set(i, sp[g() % sp.size()]);
    for (uint32_t f : {kAll, kPlainOnly, kZipOnly, kHuffOnly}) round_trip(x, f);
    // Only specials.
    Tensor y = make(t, int64_t(sp.size()) * 100);
    for (int64_t i = 0; i < y.n(); ++i) y.set(i, sp[size_t(i) % sp.size()]);
    for (uint32_t f : {kAll, kPlainOnly, kZipOnly, kHuffOnly}) round_trip(y, f);
  }
}

TEST(LosslessRoundTrip, AllEqualExponentsUseTheConstantSection) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    // Values in [1, 2): one exponent, random mantissas and signs.
    std::mt19937 g(9);
    std::uniform_real_distribution<float> u(1.f, 1.9f);  // 1.9: no rounding up to 2 in bf16
    Tensor x = make(t, 4096 + 5);
    for (int64_t i = 0; i < x.n(); ++i) x.set(i, from_float(t, (g() & 1 ? -1.f : 1.f) * u(g)));
    Coded c = round_trip(x);
    EXPECT_EQ(c.info.format, ExpFormat::kConst) << dtype_name(t);
    EXPECT_EQ(c.msg.size(), lossless_static_bytes(t, x.n()) + 1);
    // All zeros (exponent 0): the same.
    Tensor z = make(t, 1000);
    EXPECT_EQ(round_trip(z).info.format, ExpFormat::kConst);
    // With the constant format disallowed, Huffman cannot go below 1 bit:
    // it must not be chosen over zip or plain unless smaller.
    round_trip(x, kZipOnly);
    round_trip(x, kPlainOnly);
  }
}

TEST(LosslessRoundTrip, ExponentsSpreadOverTheFullRange) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int E = t == DType::kF16 ? 32 : 256;
    std::mt19937 g(10);
    Tensor x = make(t, 50000);
    for (int64_t i = 0; i < x.n(); ++i) {
      const uint32_t e = uint32_t(i % E), r = uint32_t(g());
      uint32_t w;
      if (t == DType::kF32) w = (r & 0x807fffffu) | (e << 23);
      else if (t == DType::kBF16) w = (r & 0x807fu) | (e << 7);
      else w = (r & 0x83ffu) | (e << 10);
      x.set(i, w);
    }
    for (uint32_t f : {kAll, kPlainOnly, kZipOnly, kHuffOnly}) round_trip(x, f);
    // Uniform exponents: no coder beats the plain section.
    EXPECT_EQ(encode(x).info.format, ExpFormat::kPlain) << dtype_name(t);
    // Geometric spread over the full range: Huffman with long codes.
    Tensor y = make(t, 50000);
    std::geometric_distribution<int> geo(0.3);
    for (int64_t i = 0; i < y.n(); ++i) {
      const uint32_t e = uint32_t(std::min(geo(g), E - 1)), r = uint32_t(g());
      uint32_t w;
      if (t == DType::kF32) w = (r & 0x807fffffu) | (e << 23);
      else if (t == DType::kBF16) w = (r & 0x807fu) | (e << 7);
      else w = (r & 0x83ffu) | (e << 10);
      y.set(i, w);
    }
    Coded c = round_trip(y);
    EXPECT_EQ(c.info.format, ExpFormat::kHuffman) << dtype_name(t);
    round_trip(y, kZipOnly);
  }
}

TEST(LosslessRoundTrip, EmptyAndOddLengths) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t n : {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 127, 1023, 1024, 1025, 1031, 4099,
                      65537}) {
      Tensor x = gaussian(t, n, 1e-3f, uint32_t(n + 1));
      for (uint32_t f : {kAll, kPlainOnly, kZipOnly, kHuffOnly}) round_trip(x, f);
    }
    // Empty: header only, no dynamic part.
    Coded c = encode(make(t, 0));
    EXPECT_EQ(c.msg.size(), 16u);
  }
}

// ---- byte accounting against independent counts --------------------------------------

TEST(LosslessAccounting, ZipSizeIsTableCountsPlanesAndEscapes) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (int64_t n : {int64_t(8), int64_t(1000), int64_t(70001)}) {
      Tensor x = gaussian(t, n, 1e-2f, uint32_t(n));
      // Heavy tail: a few large values widen the exponent range.
      std::mt19937 g(3);
      for (int64_t i = 0; i < n; i += 17) x.set(i, from_float(t, std::ldexp(1.f, int(g() % 20) - 10)));
      Coded c = encode(x, kZipOnly);
      const int64_t G = n / 8, body = 8 * G, S = (body + 1023) / 1024;
      std::map<int, int64_t> hist;
      for (int64_t i = 0; i < body; ++i) ++hist[exponent_of(t, x.word(i))];
      std::vector<int64_t> counts;
      for (auto& kv : hist) counts.push_back(kv.second);
      std::sort(counts.rbegin(), counts.rend());
      int64_t covered = 0;
      for (size_t i = 0; i < counts.size() && i < 7; ++i) covered += counts[i];
      const int64_t zip = 8 + 2 * S + 3 * G + (body - covered);
      const int64_t plain = (t == DType::kF16 ? 5 : 8) * G;
      const int64_t static_bytes = 16 + (t == DType::kBF16 ? 8 : t == DType::kF16 ? 11 : 24) * G +
                                   (n - body) * esize(t);
      EXPECT_EQ(c.info.candidate_bytes[int(ExpFormat::kZip)], zip);
      EXPECT_EQ(int64_t(c.msg.size()), static_bytes + std::min(zip, plain)) << dtype_name(t) << " n=" << n;
    }
}

TEST(LosslessAccounting, HuffmanWithinOneBitOfEntropyAndChoiceIsSmallest) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (float sigma : {1e-2f, 1e-4f}) {
      const int64_t n = 131072;
      Tensor x = gaussian(t, n, sigma, 21);
      Coded all = encode(x, kAll);
      Coded hf = encode(x, kHuffOnly);
      Coded zp = encode(x, kZipOnly);
      // The chosen message is the smallest of the candidates.
      EXPECT_LE(all.msg.size(), hf.msg.size());
      EXPECT_LE(all.msg.size(), zp.msg.size());
      EXPECT_LE(all.msg.size(), encode(x, kPlainOnly).msg.size());
      // Entropy computed here: H <= Huffman bits per exponent < H + 1 (+ table,
      // segment lengths and byte alignment: <= 1 + 1.5*256 + 3 bytes per segment).
      std::map<int, int64_t> hist;
      for (int64_t i = 0; i < n; ++i) ++hist[exponent_of(t, x.word(i))];
      if (hist.size() < 2) continue;
      double H = 0;
      for (auto& kv : hist) H -= double(kv.second) * std::log2(double(kv.second) / double(n));
      const int64_t dyn = int64_t(hf.msg.size()) - int64_t(lossless_static_bytes(t, n));
      ASSERT_EQ(hf.info.format, ExpFormat::kHuffman);
      EXPECT_GE(8.0 * double(dyn), H);
      EXPECT_LT(8.0 * double(dyn), H + double(n) + 8.0 * (1 + 1.5 * 256 + 3.0 * (n / 1024)));
      // Gallager's bound on Huffman redundancy: < p_max + 0.0861 when p_max < 1/2
      // (the 11-bit limit never binds here), plus the table, segment lengths
      // and byte alignment: 8 * (1 + 1.5 k + 3 S) bits per block.
      int64_t cmax = 0;
      for (auto& kv : hist) cmax = std::max(cmax, kv.second);
      const double pmax = double(cmax) / double(n);
      const double k = double(hist.size()), S = double((n + 1023) / 1024);
      const double red = pmax < 0.5 ? pmax + 0.0861 : 1.0;
      EXPECT_LT(8.0 * double(dyn) / double(n), (H + 8.0 * (1 + 1.5 * k + 3 * S)) / double(n) + red)
          << dtype_name(t) << " sigma " << sigma;
      EXPECT_NEAR(hf.info.entropy_bits, H, 1e-6 * H);
    }
}

// ---- package-merge against brute force -----------------------------------------------

uint64_t cost(const std::vector<uint64_t>& f, const std::vector<uint8_t>& l) {
  uint64_t c = 0;
  for (size_t i = 0; i < f.size(); ++i) c += f[i] * l[i];
  return c;
}

uint64_t brute_force(const std::vector<uint64_t>& f, int maxlen) {
  const int k = int(f.size());
  std::vector<uint8_t> l(size_t(k), 1);
  uint64_t best = UINT64_MAX;
  for (;;) {
    double kraft = 0;
    for (int i = 0; i < k; ++i) kraft += std::ldexp(1.0, -l[size_t(i)]);
    if (kraft <= 1.0) best = std::min(best, cost(f, l));
    int i = 0;
    while (i < k && l[size_t(i)] == maxlen) l[size_t(i++)] = 1;
    if (i == k) break;
    ++l[size_t(i)];
  }
  return best;
}

TEST(LosslessHuffman, PackageMergeIsOptimalUnderTheLengthLimit) {
  std::mt19937 g(4);
  for (int trial = 0; trial < 300; ++trial) {
    const int k = 2 + int(g() % 6);
    int maxlen = 1;
    while ((1 << maxlen) < k) ++maxlen;
    maxlen += int(g() % 3);
    std::vector<uint64_t> f(static_cast<size_t>(k));
    for (auto& v : f) v = trial % 3 == 0 ? uint64_t(1) << (g() % 20) : 1 + g() % 1000;
    std::vector<uint8_t> l(static_cast<size_t>(k));
    lossless_code_lengths(f.data(), k, maxlen, l.data());
    uint32_t kraft = 0;
    for (auto v : l) {
      ASSERT_GE(v, 1);
      ASSERT_LE(v, maxlen);
      kraft += 1u << (maxlen - v);
    }
    ASSERT_LE(kraft, 1u << maxlen);
    ASSERT_EQ(cost(f, l), brute_force(f, maxlen)) << "k=" << k << " maxlen=" << maxlen;
  }
  // Fibonacci weights want a 30-deep tree: the limit of 11 must hold with 256 symbols.
  std::vector<uint64_t> fib(256);
  fib[0] = fib[1] = 1;
  for (size_t i = 2; i < 40; ++i) fib[i] = fib[i - 1] + fib[i - 2];
  for (size_t i = 40; i < 256; ++i) fib[i] = 1;
  std::vector<uint8_t> l(256);
  lossless_code_lengths(fib.data(), 256, 11, l.data());
  uint32_t kraft = 0;
  for (auto v : l) {
    ASSERT_GE(v, 1);
    ASSERT_LE(v, 11);
    kraft += 1u << (11 - v);
  }
  EXPECT_EQ(kraft, 2048u);  // optimal codes are complete
}

// ---- the shared __host__ __device__ functions agree with the CPU loops -----------------

TEST(LosslessShared, SplitAndMergeGroupsMatchTheCpuLoops) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    Tensor x = all_patterns_padded(t == DType::kF32 ? DType::kBF16 : t, 1, 3);
    if (t == DType::kF32) {
      x = gaussian(t, 20011, 1.f, 4);
      std::mt19937 g(2);
      for (int64_t i = 0; i < x.n(); i += 3) x.set(i, uint32_t(g()));
    }
    const int64_t n = x.n();
    Coded c = encode(x, kPlainOnly);
    const lossless::Layout L = lossless::make_layout(t, n);
    std::vector<uint8_t> msg(size_t(L.static_bytes), 0), exps(size_t(L.body));
    std::vector<uint8_t> back(x.bytes.size());
    DQ_DISPATCH_DTYPE(t, T, [&] {
      using W = typename lossless::Split<T>::word;
      const W* v = reinterpret_cast<const W*>(x.bytes.data());
      for (int64_t g = 0; g < L.groups; ++g)
        lossless::split_group<T>(v, g, L.groups, msg.data() + 16, exps.data());
      W* o = reinterpret_cast<W*>(back.data());
      for (int64_t g = 0; g < L.groups; ++g)
        lossless::merge_group<T>(c.msg.data() + 16, exps.data(), g, L.groups, o);
    });
    // SM planes identical to the encoder's static part.
    EXPECT_TRUE(std::equal(msg.begin() + 16, msg.begin() + L.tail_offset, c.msg.begin() + 16))
        << dtype_name(t);
    // Exponents: the plain section (bf16/fp32 one byte each; fp16 via the 5 planes).
    std::vector<uint8_t> ref(size_t(L.body));
    for (int64_t i = 0; i < L.body; ++i) ref[size_t(i)] = uint8_t(exponent_of(t, x.word(i)));
    EXPECT_EQ(exps, ref);
    EXPECT_TRUE(std::equal(back.begin(), back.begin() + L.body * esize(t), x.bytes.begin()));
  }
}

TEST(LosslessShared, HuffmanSectionMatchesTheSingleSegmentReference) {
  // The CPU encoder interleaves segments and the decoder uses a multi-symbol
  // table; the GPU runs huff_encode_segment / huff_decode_segment per
  // segment. Both must give the same bytes and symbols.
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (int64_t n : {int64_t(1000), int64_t(8 * 1024 * 5 + 24), int64_t(131072)}) {
      Tensor x = gaussian(t, n, 1e-3f, uint32_t(n));
      std::mt19937 g(1);
      for (int64_t i = 0; i < n; i += 29) x.set(i, uint32_t(g()));  // long codes too
      Coded c = encode(x, kHuffOnly);
      ASSERT_EQ(c.info.format, ExpFormat::kHuffman);
      const lossless::Layout L = lossless::make_layout(t, n);
      const uint8_t* sec = c.msg.data() + L.static_bytes;
      const int64_t d = int64_t(c.msg.size()) - L.static_bytes;
      const int k = sec[0] + 1;
      std::vector<uint8_t> len(static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) len[size_t(i)] = uint8_t((sec[1 + k + i / 2] >> (4 * (i & 1))) & 0xf);
      uint16_t code[256] = {}, table[lossless::kDecodeTableSize];
      uint8_t clen[256] = {};
      lossless::huff_build_tables(k, sec + 1, len.data(), table, code, clen);
      const int64_t hb = 1 + k + (k + 1) / 2 + 2 * L.segments;
      std::vector<uint8_t> exps(size_t(L.body)), ref(size_t(L.body));
      for (int64_t i = 0; i < L.body; ++i) ref[size_t(i)] = uint8_t(exponent_of(t, x.word(i)));
      std::vector<uint8_t> stream(size_t(d - hb) + 64);
      uint64_t off = 0;
      for (int64_t s = 0; s < L.segments; ++s) {
        const int cnt = lossless::segment_count(L.body, s);
        const uint32_t sb = load_u16(sec + 1 + k + (k + 1) / 2 + 2 * s);
        const uint32_t rb = lossless::huff_encode_segment(ref.data() + s * 1024, cnt, code, clen,
                                                          stream.data() + off);
        ASSERT_EQ(rb, sb) << "segment " << s;
        ASSERT_TRUE(lossless::huff_decode_segment(sec + hb + off, sb, uint64_t(d - hb) - off, cnt,
                                                  table, exps.data() + s * 1024));
        off += sb;
      }
      ASSERT_EQ(int64_t(off), d - hb);
      EXPECT_TRUE(std::equal(stream.begin(), stream.begin() + long(off), sec + hb));
      EXPECT_EQ(exps, ref);
    }
}

// ---- the codec reproduces the identity codec's arithmetic bit for bit ---------------------

Tensor nasty(DType t, int64_t n, uint32_t seed) {
  Tensor x = gaussian(t, n, 1.f, seed);
  const auto sp = specials(t);
  std::mt19937 g(seed * 7 + 1);
  for (int64_t i = 0; i < n; ++i)
    if (g() % 3 == 0) x.set(i, sp[g() % sp.size()]);
  return x;
}

TEST(LosslessVsIdentity, EveryRoleGivesTheIdentityCodecsBits) {
  IdentityCodec id;
  LosslessCodec lz;
  RngCtx rng;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int64_t numel = 5003;
    Plan plan = make_lossless_plan(t, numel, 2);
    Block b{plan.chunk_begin[1], plan.chunk_begin[2]};  // the last (partial) units
    const int64_t e0 = b.w0 * plan.unit, n = numel - e0;
    const Tensor mine = nasty(t, numel, 1), recv = nasty(t, numel, 2);
    // The identity message and the lossless message of the same values.
    Local rl;
    rl.bucket = recv.bytes.data();
    std::vector<uint8_t> im(id.max_message_bytes(plan, b)), lm(lz.max_message_bytes(plan, b));
    im.resize(id.compress(rl, plan, b, rng, im.data()));
    lm.resize(lz.compress(rl, plan, b, rng, lm.data()));
    ASSERT_EQ(lm.size(), lz.static_bytes(plan, b) + lz.dynamic_bytes(lm.data(), plan, b));

    // Float accumulators holding partial sums (wire order, from w0).
    std::vector<float> acc_src(size_t(b.units() * plan.unit));
    std::mt19937 g(5);
    for (size_t i = 0; i < acc_src.size(); ++i)
      acc_src[i] = i % 11 == 0 ? bits_f32(0x7fc00000u | uint32_t(g() & 0xffff)) : float(g() % 1000) * 0.37f;
    for (int from_acc = 0; from_acc < 2; ++from_acc) {
      Local x;
      if (from_acc) x.acc = acc_src.data(), x.acc_w0 = b.w0;
      else x.bucket = mine.bytes.data();
      // compress
      std::vector<uint8_t> ic(id.max_message_bytes(plan, b)), lc(lz.max_message_bytes(plan, b));
      ic.resize(id.compress(x, plan, b, rng, ic.data()));
      lc.resize(lz.compress(x, plan, b, rng, lc.data()));
      std::vector<uint8_t> dec(size_t(n * esize(t)));
      lossless_decode(lc.data(), lc.size(), t, n, dec.data());
      EXPECT_EQ(dec, ic) << "compress " << dtype_name(t) << " from_acc=" << from_acc;
      // decompress_accumulate
      std::vector<float> ia(acc_src.size()), la(acc_src.size());
      id.decompress_accumulate(im.data(), im.size(), x, plan, b, ia.data());
      lz.decompress_accumulate(lm.data(), lm.size(), x, plan, b, la.data());
      EXPECT_EQ(0, std::memcmp(ia.data(), la.data(), size_t(n) * 4)) << "DA " << dtype_name(t);
      // decompress_accumulate_recompress
      std::vector<uint8_t> io(id.max_message_bytes(plan, b)), lo(lz.max_message_bytes(plan, b));
      io.resize(id.decompress_accumulate_recompress(im.data(), im.size(), x, plan, b, rng, io.data()));
      lo.resize(lz.decompress_accumulate_recompress(lm.data(), lm.size(), x, plan, b, rng, lo.data()));
      lossless_decode(lo.data(), lo.size(), t, n, dec.data());
      EXPECT_EQ(dec, io) << "DAR " << dtype_name(t) << " from_acc=" << from_acc;
    }
    // decompress with divisor 1 and 3 into a bucket.
    for (float div : {1.0f, 3.0f}) {
      std::vector<uint8_t> ib(mine.bytes), lb(mine.bytes);
      Output yi, yl;
      yi.bucket = ib.data(), yl.bucket = lb.data();
      yi.divisor = yl.divisor = div;
      id.decompress(im.data(), im.size(), plan, b, yi);
      lz.decompress(lm.data(), lm.size(), plan, b, yl);
      EXPECT_EQ(ib, lb) << "decompress " << dtype_name(t) << " divisor " << div;
    }
  }
}

// ---- malformed messages ------------------------------------------------------------------

void expect_malformed(const std::vector<uint8_t>& m, DType t, int64_t n, const char* what) {
  std::vector<uint8_t> out(size_t(n * esize(t)) + 1);
  EXPECT_THROW(lossless_decode(m.data(), m.size(), t, n, out.data()), MalformedMessage) << what;
}

void fix_crc(std::vector<uint8_t>& m) {
  const uint16_t c = lossless::crc16(m.data(), 14);
  m[14] = uint8_t(c), m[15] = uint8_t(c >> 8);
}

void set_u32(std::vector<uint8_t>& m, size_t off, uint32_t v) { std::memcpy(m.data() + off, &v, 4); }

std::vector<Coded> sample_messages(DType t, int64_t n) {
  std::vector<Coded> v;
  Tensor x = gaussian(t, n, 1e-2f, 31);
  std::mt19937 g(1);
  for (int64_t i = 0; i < n; i += 23) x.set(i, from_float(t, std::ldexp(1.f, int(g() % 30) - 15)));
  for (uint32_t f : {kPlainOnly, kZipOnly, kHuffOnly}) v.push_back(encode(x, f));
  Tensor c = make(t, n);
  for (int64_t i = 0; i < n; ++i) c.set(i, from_float(t, 1.5f));
  v.push_back(encode(c, kAll));
  return v;
}

TEST(LosslessMalformed, TruncatedTooLongWrongVersionAndSizes) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int64_t n = 3001;
    for (const Coded& c : sample_messages(t, n)) {
      const auto& m = c.msg;
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + lossless::exp_format_name(c.info.format));
      // Truncated at every length in a sample, and one byte too long.
      for (size_t len = 0; len < m.size(); len += 1 + len / 8) {
        std::vector<uint8_t> tr(m.begin(), m.begin() + long(len));
        expect_malformed(tr, t, n, "truncated");
      }
      std::vector<uint8_t> longer(m);
      longer.push_back(0);
      expect_malformed(longer, t, n, "too long");
      // Wrong version and wrong magic, with a valid checksum.
      std::vector<uint8_t> v(m);
      v[1] = 2;
      fix_crc(v);
      try {
        lossless_dynamic_bytes(v.data(), t, n);
        ADD_FAILURE() << "wrong version accepted";
      } catch (const MalformedMessage& e) {
        EXPECT_NE(std::string(e.what()).find("version"), std::string::npos) << e.what();
      }
      v = m;
      v[0] = 'X';
      fix_crc(v);
      expect_malformed(v, t, n, "magic");
      // Size field too large (valid checksum): rejected before any dynamic receive.
      v = m;
      set_u32(v, 8, uint32_t(lossless_max_dynamic_bytes(t, n) + 1));
      fix_crc(v);
      EXPECT_THROW(lossless_dynamic_bytes(v.data(), t, n), MalformedMessage);
      set_u32(v, 8, 0xffffffffu);
      fix_crc(v);
      EXPECT_THROW(lossless_dynamic_bytes(v.data(), t, n), MalformedMessage);
      // Wrong count, dtype, format, reserved.
      v = m;
      set_u32(v, 4, uint32_t(n + 1));
      fix_crc(v);
      expect_malformed(v, t, n, "count");
      v = m;
      v[2] = uint8_t((v[2] + 1) % 3);
      fix_crc(v);
      expect_malformed(v, t, n, "dtype");
      v = m;
      v[3] = 4;
      fix_crc(v);
      expect_malformed(v, t, n, "format");
      v = m;
      v[12] = 1;
      fix_crc(v);
      expect_malformed(v, t, n, "reserved");
      // Every single header byte flipped (checksum not fixed): always caught.
      for (int i = 0; i < 16; ++i)
        for (int bit = 0; bit < 8; ++bit) {
          v = m;
          v[size_t(i)] ^= uint8_t(1u << bit);
          EXPECT_THROW(lossless_dynamic_bytes(v.data(), t, n), MalformedMessage) << "byte " << i;
          expect_malformed(v, t, n, "flipped header");
        }
      std::mt19937 g(7);
      for (int trial = 0; trial < 200; ++trial) {
        v = m;
        v[g() % 16] ^= uint8_t(1 + g() % 255);
        expect_malformed(v, t, n, "random header byte");
      }
    }
  }
}

TEST(LosslessMalformed, SectionTablesAndOffsetsOutOfRange) {
  const DType t = DType::kBF16;
  const int64_t n = 5000;  // 625 groups, 5 segments
  const auto msgs = sample_messages(t, n);
  const size_t sb = lossless_static_bytes(t, n);
  const Coded& zip = msgs[1];
  const Coded& huf = msgs[2];
  ASSERT_EQ(zip.info.format, ExpFormat::kZip);
  ASSERT_EQ(huf.info.format, ExpFormat::kHuffman);
  auto corrupt = [&](const Coded& c, size_t off, uint8_t val, const char* what) {
    std::vector<uint8_t> v(c.msg);
    ASSERT_LT(sb + off, v.size());
    v[sb + off] = val;
    expect_malformed(v, t, n, what);
  };
  // zip: padding byte, escape counts larger than the segment / than the list.
  corrupt(zip, 7, 1, "zip padding");
  corrupt(zip, 8, 0xff, "zip count low byte");
  corrupt(zip, 9, 0xff, "zip count high byte");
  {
    std::vector<uint8_t> v(zip.msg);  // shift one escape from segment 0 to segment 1
    uint16_t c0, c1;
    std::memcpy(&c0, v.data() + sb + 8, 2);
    std::memcpy(&c1, v.data() + sb + 10, 2);
    if (c0 > 0) {
      --c0, ++c1;
      std::memcpy(v.data() + sb + 8, &c0, 2);
      std::memcpy(v.data() + sb + 10, &c1, 2);
      expect_malformed(v, t, n, "zip counts disagree with codes");
    }
  }
  // Huffman: k, symbol order, lengths, segment sizes.
  const int k = int(huf.msg[sb]) + 1;
  corrupt(huf, 0, 0, "k = 1");
  corrupt(huf, 0, 0xff, "k = 256 (table past the section)");
  corrupt(huf, 2, huf.msg[sb + 1], "repeated symbol");
  corrupt(huf, size_t(1 + k), 0x00, "zero code length");
  corrupt(huf, size_t(1 + k), 0xcc, "code length 12");
  corrupt(huf, size_t(1 + k), 0x11, "over-subscribed lengths");
  const size_t meta = size_t(1 + k + (k + 1) / 2);
  corrupt(huf, meta, 0xff, "segment length too large");
  corrupt(huf, meta + 1, 0xff, "segment length far too large");
  {
    std::vector<uint8_t> v(huf.msg);
    v[sb + meta] = 0, v[sb + meta + 1] = 0;
    expect_malformed(v, t, n, "segment length zero");
  }
  {
    std::vector<uint8_t> v(huf.msg);  // a segment shortened by one, the next lengthened
    uint16_t a, b;
    std::memcpy(&a, v.data() + sb + meta, 2);
    std::memcpy(&b, v.data() + sb + meta + 2, 2);
    --a, ++b;
    std::memcpy(v.data() + sb + meta, &a, 2);
    std::memcpy(v.data() + sb + meta + 2, &b, 2);
    expect_malformed(v, t, n, "segment boundary moved");
  }
}

TEST(LosslessMalformed, RandomCorruptionNeverReadsOutOfBounds) {
  // Byte flips in the dynamic part are not all detectable (no checksum over
  // data); the decoder must either throw MalformedMessage or return, reading
  // only the message (AddressSanitizer checks the reads in the ASan build).
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int64_t n = 2051;
    std::mt19937 g(13);
    for (const Coded& c : sample_messages(t, n)) {
      const size_t sb = lossless_static_bytes(t, n);
      for (int trial = 0; trial < 300; ++trial) {
        // Exactly-sized heap copies so ASan sees any overrun.
        std::unique_ptr<uint8_t[]> v(new uint8_t[c.msg.size()]);
        std::memcpy(v.get(), c.msg.data(), c.msg.size());
        const int flips = 1 + int(g() % 4);
        for (int f = 0; f < flips; ++f) {
          const size_t span = c.msg.size() - sb;
          if (span == 0) break;
          v[sb + g() % span] ^= uint8_t(1 + g() % 255);
        }
        std::unique_ptr<uint8_t[]> out(new uint8_t[size_t(n * esize(t))]);
        try {
          lossless_decode(v.get(), c.msg.size(), t, n, out.get());
        } catch (const MalformedMessage&) {
        }
      }
    }
  }
}

// ---- statistics -----------------------------------------------------------------------------

TEST(LosslessStatsTest, EntropyOfAKnownDistributionAndAccounting) {
  // Exponents cycling through 4 values equally often: entropy exactly 2 bits.
  const DType t = DType::kBF16;
  const int64_t n = 1 << 18;
  std::mt19937 g(17);
  Tensor x = make(t, n);
  for (int64_t i = 0; i < n; ++i) x.set(i, (uint32_t(g()) & 0x807fu) | (uint32_t(120 + (i & 3)) << 7));
  const LosslessStats s = lossless_stats(x.bytes.data(), t, n, 64 << 10);
  EXPECT_DOUBLE_EQ(s.exponent_entropy, 2.0);
  EXPECT_DOUBLE_EQ(s.block_exponent_entropy, 2.0);
  // Huffman on 4 equally likely symbols: exactly 2 bits, plus per block a
  // 7-byte table and 2 bytes per 1024-exponent segment.
  const int64_t blocks = n / (32 * 1024);
  EXPECT_EQ(s.blocks, blocks);
  EXPECT_EQ(s.blocks_by_format[int(ExpFormat::kHuffman)], blocks);
  EXPECT_EQ(s.exponent_bytes, n / 4 + blocks * 7 + (n / 1024) * 2);
  EXPECT_EQ(s.coded_bytes, blocks * 16 + n + s.exponent_bytes);
  EXPECT_EQ(s.raw_bytes, 2 * n);
  EXPECT_DOUBLE_EQ(s.ratio, double(s.coded_bytes) / double(2 * n));
  EXPECT_NEAR(s.exponent_bits, 2.0 + 8.0 * double(blocks * 7 + (n / 1024) * 2) / double(n), 1e-12);
}

}  // namespace
}  // namespace dynamiq
