// The GPU encode's format choice (plan_kernel, csrc/kernels/lossless/cuda/
// lossless_plan_kernel.cu) against the host's lossless_plan_encode, which the
// CPU encoder uses: the same format, section size, section table and encoder
// tables (zip codes; Huffman codes and lengths, i.e. the same package-merge)
// for histograms that reach the 11-bit length limit (Fibonacci weights), tie
// everywhere (equal weights), hold 1, 2 or 256 exponents, or are random, in
// each dtype's alphabet and under every format mask. Runs on a GPU, and in CI
// on the CPU emulation of CUDA (tests/cpp/cuda_emu).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/lossless/cuda/lossless_device.h"
#include "kernels/lossless/lossless_cuda.h"

namespace dynamiq {
namespace {

using lossless::ExpFormat;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Hist {
  std::string what;
  DType t;
  uint64_t h[256];
  int64_t n;  // values: the body (sum of h) plus a tail of n % 8
};

// A histogram with freq[i] at exponent e0 + i * step, padded (on the largest
// count) to a multiple of 8 values, with a tail of `tail` values.
Hist make_hist(const std::string& what, DType t, const std::vector<uint64_t>& freq, int e0, int step, int tail) {
  Hist r{what, t, {}, 0};
  uint64_t sum = 0;
  size_t big = 0;
  for (size_t i = 0; i < freq.size(); ++i) {
    r.h[e0 + int(i) * step] = freq[i];
    sum += freq[i];
    if (freq[i] > freq[big]) big = i;
  }
  const uint64_t pad = (8 - sum % 8) % 8;
  r.h[e0 + int(big) * step] += pad;
  r.n = int64_t(sum + pad) + tail;
  return r;
}

std::vector<Hist> histograms() {
  std::vector<Hist> v;
  std::mt19937 g(77);
  // Fibonacci weights: the optimal code is deeper than 11 bits from k = 13 on
  for (int k : {2, 12, 13, 20, 26, 30}) {
    std::vector<uint64_t> f(static_cast<size_t>(k));
    uint64_t a = 1, b = 1;
    for (int i = 0; i < k; ++i) {
      f[size_t(i)] = a;
      const uint64_t c = a + b;
      a = b;
      b = c;
    }
    v.push_back(make_hist("fibonacci k " + std::to_string(k), DType::kBF16, f, 200 - k, 1, 3));
  }
  // equal weights: ties in every sort and merge
  for (int k : {1, 2, 3, 7, 8, 9, 100, 255, 256})
    v.push_back(make_hist("equal k " + std::to_string(k), DType::kF32, std::vector<uint64_t>(size_t(k), 40), 0, 1, 0));
  for (int k : {2, 17, 32}) v.push_back(make_hist("fp16 equal k " + std::to_string(k), DType::kF16,
                                                  std::vector<uint64_t>(size_t(k), 24), 32 - k, 1, 5));
  // geometric, as gradients' exponents: a few common ones, a long tail
  for (int k : {5, 20, 60}) {
    std::vector<uint64_t> f(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) f[size_t(i)] = 1 + (uint64_t(1) << 16 >> std::min(i, 16)) * (1 + g() % 3);
    v.push_back(make_hist("geometric k " + std::to_string(k), DType::kBF16, f, 100, 1, 1));
  }
  // random weights, many ties, random alphabets
  for (int r = 0; r < 24; ++r) {
    const DType t = r % 3 == 0 ? DType::kF16 : r % 3 == 1 ? DType::kBF16 : DType::kF32;
    const int alphabet = t == DType::kF16 ? 32 : 256;
    const int k = 1 + int(g() % uint32_t(alphabet));
    const int step = alphabet / k;
    std::vector<uint64_t> f(static_cast<size_t>(k));
    for (auto& x : f) x = r % 2 ? 1 + g() % 4 : 1 + g() % 5000;
    v.push_back(make_hist("random " + std::to_string(r) + " k " + std::to_string(k), t, f, 0, step, int(g() % 8)));
  }
  // a body of 1 to 3 segments of one group each way
  v.push_back(make_hist("one group", DType::kBF16, {3, 5}, 120, 1, 0));
  return v;
}

TEST(CudaLosslessPlan, DeviceChoiceIsTheHostPlanByteForByte) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  LosslessEncodeState* dst = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dst), sizeof(LosslessEncodeState)), cudaSuccess);
  int huffman = 0, zip = 0, constant = 0, limited = 0;
  for (const Hist& hc : histograms())
    for (uint32_t formats : {0xfu, 0x9u, 0x5u, 0x3u, 0x1u}) {
      SCOPED_TRACE(hc.what + " formats " + std::to_string(formats));
      LosslessOptions opt;
      opt.formats = formats;
      LosslessEncodePlan p;
      lossless_plan_encode(hc.t, hc.n, hc.h, opt, p);
      LosslessEncodeState s{};
      for (int e = 0; e < 256; ++e) s.hist[e] = uint32_t(hc.h[e]);
      ASSERT_EQ(cudaMemcpy(dst, &s, sizeof(s), cudaMemcpyHostToDevice), cudaSuccess);
      const lossless::Layout L = lossless::make_layout(hc.t, hc.n);
      const size_t cap = size_t(L.static_bytes + L.plain_bytes);
      uint8_t* dmsg = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dmsg), cap), cudaSuccess);
      ASSERT_EQ(cudaMemset(dmsg, 0xee, cap), cudaSuccess);
      lossless_plan_cuda(hc.t, hc.n, formats, dst, dmsg, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(&s, dst, sizeof(s), cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<uint8_t> msg(cap);
      ASSERT_EQ(cudaMemcpy(msg.data(), dmsg, cap, cudaMemcpyDeviceToHost), cudaSuccess);
      cudaFree(dmsg);

      ASSERT_EQ(ExpFormat(s.format), p.format);
      EXPECT_EQ(s.bound, p.section_bytes);
      EXPECT_EQ(s.prefix_bytes, p.prefix_bytes);
      for (int e = 0; e < 256; ++e) ASSERT_EQ(s.hist[e], 0u) << "the histogram is cleared for the next encode";
      const uint8_t* sec = msg.data() + L.static_bytes;
      if (p.format == ExpFormat::kConst) {
        ++constant;
        EXPECT_EQ(sec[0], p.syms[0]);
      }
      if (p.format == ExpFormat::kZip || p.format == ExpFormat::kHuffman) {
        EXPECT_EQ(std::vector<uint8_t>(sec, sec + p.prefix_bytes), std::vector<uint8_t>(p.prefix, p.prefix + p.prefix_bytes));
      }
      if (p.format == ExpFormat::kZip) {
        ++zip;
        for (int e = 0; e < 256; ++e) ASSERT_EQ(s.code_of[e], p.zip_code_of[e]) << "exponent " << e;
      }
      if (p.format == ExpFormat::kHuffman) {
        ++huffman;
        int longest = 0;
        for (int e = 0; e < 256; ++e) {
          ASSERT_EQ(s.huff[e], p.huff_len[e] ? p.huff_code[e] | uint32_t(p.huff_len[e]) << 16 : 0u) << "exponent " << e;
          longest = std::max<int>(longest, p.huff_len[e]);
        }
        limited += longest == lossless::kMaxCodeLen;
      }
    }
  cudaFree(dst);
  // the choices the comparison covered
  EXPECT_GT(huffman, 30);
  EXPECT_GT(zip, 10);
  EXPECT_GE(constant, 2);
  EXPECT_GT(limited, 4) << "length-limited codes (package-merge at its limit)";
}

}  // namespace
}  // namespace dynamiq
