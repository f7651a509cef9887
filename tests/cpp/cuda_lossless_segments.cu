// What the lossless kernels' warps could get wrong, checked against the CPU
// codec bit for bit (the GPU message equals the CPU one; the GPU decode of the
// CPU message gives the values back): segments full of zip escapes (a warp
// prefix sum places them), partial last segments and lanes with fewer than 32
// exponents, one exponent only (const) with every sign and mantissa, Huffman
// codes at the 11-bit limit, streams of equal-length codes whose slices
// (huff_segment_warp) start misaligned and need many correction rounds, every
// dtype, and unaligned buffers (the kernels' byte-wise paths). Runs on a GPU,
// and in CI on the CPU emulation of CUDA (tests/cpp/cuda_emu).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_lossless_device_decode.h"
#include "kernels/lossless/lossless_cuda.h"

namespace dynamiq {
namespace {

using lossless::ExpFormat;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// n values of dtype t with exponent exp(i) and random sign and mantissa.
std::vector<uint8_t> values_with(DType t, int64_t n, uint32_t seed, const std::function<int(int64_t)>& exp) {
  std::mt19937 g(seed);
  const int es = dtype_size(t);
  std::vector<uint8_t> v(size_t(n * es));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t r = g();
    const uint32_t e = uint32_t(exp(i));
    uint32_t w;
    if (t == DType::kF32) w = (r & 0x807fffffu) | e << 23;
    else if (t == DType::kBF16) w = (r & 0x807fu) | e << 7;
    else w = (r & 0x83ffu) | (e & 0x1fu) << 10;
    std::memcpy(v.data() + i * es, &w, size_t(es));
  }
  return v;
}

struct Result {
  ExpFormat format;
};

// Encodes x on the CPU and on the device, with the message and the values at
// byte offsets msg_off and x_off of their device buffers; expects the same
// bytes, and the device decode of the CPU message (at msg_off) to give x.
Result round_trip(DType t, int64_t n, const std::vector<uint8_t>& x, uint32_t formats, size_t msg_off = 0,
                  size_t x_off = 0) {
  LosslessOptions opt;
  opt.formats = formats;
  const size_t cap = lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n);
  std::vector<uint8_t> cpu(cap);
  cpu.resize(lossless_encode(x.data(), t, n, cpu.data(), opt));
  uint8_t *dx = nullptr, *dmsg = nullptr, *dy = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dx), x.size() + x_off + 1), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dmsg), cap + msg_off + 1), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dy), x.size() + x_off + 1), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dx + x_off, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
  const size_t bytes = dqtest::encode_on_device(t, dx + x_off, n, dmsg + msg_off, formats);
  std::vector<uint8_t> gpu(bytes);
  EXPECT_EQ(cudaMemcpy(gpu.data(), dmsg + msg_off, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(gpu, cpu);
  // the CPU message, decoded on the device from an exact-size copy (a read past it faults)
  uint8_t* din = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&din), cpu.size() + msg_off), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(din + msg_off, cpu.data(), cpu.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(dqtest::decode_on_device(t, din + msg_off, cpu.size(), n, dy + x_off).kind, lossless::FaultKind::kNone);
  std::vector<uint8_t> y(x.size());
  EXPECT_EQ(cudaMemcpy(y.data(), dy + x_off, y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(y, x);
  for (uint8_t* p : {dx, dmsg, dy, din}) cudaFree(p);
  return {lossless_format_of(cpu.data())};
}

const DType kTypes[] = {DType::kBF16, DType::kF16, DType::kF32};
int bias(DType t) { return t == DType::kF16 ? 15 : 127; }

// Exponents spread evenly over 24 values (fp16: 10): 17 of every 24 are zip
// escapes (about 700 per segment), so lanes' escape counts and their prefix
// sums vary widely.
TEST(CudaLosslessSegments, ZipSegmentsFullOfEscapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n = 6 * 1024 + 8 * 37 + 3;
    std::mt19937 g(5);
    std::vector<int> e(static_cast<size_t>(n));
    const int spread = t == DType::kF16 ? 10 : 24;  // fp16: zip beats 5 plain bits below 40 % escapes
    for (auto& v : e) v = bias(t) - spread / 2 + int(g() % uint32_t(spread));
    // segment 2 escapes only in its last lane, segment 3 only at its first value (rare exponents)
    for (int64_t i = 2048; i < 3072; ++i) e[size_t(i)] = i >= 3072 - 32 ? bias(t) + 13 : bias(t);
    for (int64_t i = 3072; i < 4096; ++i) e[size_t(i)] = i == 3072 ? bias(t) + 14 : bias(t) - 1;
    const auto x = values_with(t, n, 11, [&](int64_t i) { return e[size_t(i)]; });
    EXPECT_EQ(round_trip(t, n, x, 0x5).format, ExpFormat::kZip);
  }
}

// Bodies that end inside a segment and inside a lane's 32 exponents (8 to 24
// of them), one group alone, and no body at all (tail only), every format.
TEST(CudaLosslessSegments, PartialLastSegmentsAndLanes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : kTypes)
    for (int64_t n : {int64_t(7), int64_t(8), int64_t(13), int64_t(1024 + 8), int64_t(2 * 1024 + 16 + 5),
                      int64_t(3 * 1024 + 24 + 7), int64_t(4 * 1024 + 1000)})
      for (uint32_t formats : {0xfu, 0x9u, 0x5u, 0x1u}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " n " + std::to_string(n) + " formats " + std::to_string(formats));
        std::mt19937 g(static_cast<uint32_t>(n));
        const auto x = values_with(t, n, uint32_t(n) + formats, [&](int64_t) {
          return bias(t) - 1 - int(std::min<uint32_t>(__builtin_ctz(g() | 0x100u), 7u));  // geometric
        });
        round_trip(t, n, x, formats);
      }
}

// One exponent, every sign and mantissa: const; two exponents: Huffman codes of one bit.
TEST(CudaLosslessSegments, ConstantAndTwoExponentBlocks) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n = 4099;
    EXPECT_EQ(round_trip(t, n, values_with(t, n, 3, [&](int64_t) { return bias(t) - 3; }), 0xf).format,
              ExpFormat::kConst);
    EXPECT_EQ(round_trip(t, n, values_with(t, n, 4, [&](int64_t i) { return bias(t) - 3 + int(i % 3 == 0); }), 0x9)
                  .format,
              ExpFormat::kHuffman);
  }
}

// Exponent i of a segment drawn with weight Fibonacci(i): codes up to the
// 11-bit limit, and the rarest exponents in most lanes' slices.
TEST(CudaLosslessSegments, HuffmanCodesAtTheLengthLimit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<uint64_t> cum;
  uint64_t a = 1, b = 1, total = 0;
  for (int i = 0; i < 16; ++i) {
    total += a;
    cum.push_back(total);
    const uint64_t c = a + b;
    a = b;
    b = c;
  }
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 g(8);
    const int64_t n = 9 * 1024 + 40 + 1;
    const auto x = values_with(t, n, 9, [&](int64_t) {
      const uint64_t r = g() % total;
      int i = 0;
      while (cum[size_t(i)] <= r) ++i;
      return bias(t) - 15 + i;
    });
    EXPECT_EQ(round_trip(t, n, x, 0x9).format, ExpFormat::kHuffman);
  }
}

// 2^b equally frequent exponents: every code is b bits, so a slice that starts
// off a code boundary never resynchronises, and the slices of a partial
// segment (1000 codes of 4 bits: 125 bits each) all start misaligned: the
// correction takes a round per slice, the worst case.
TEST(CudaLosslessSegments, EqualLengthCodesNeedingEveryCorrectionRound) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int bits : {3, 4, 5})
    for (int64_t n : {int64_t(1000), int64_t(3 * 1024 + 1000), int64_t(2 * 1024 + 520 + 3)}) {
      SCOPED_TRACE(std::to_string(bits) + "-bit codes, n " + std::to_string(n));
      const DType t = DType::kBF16;
      const auto x = values_with(t, n, uint32_t(n + bits), [&](int64_t i) { return 100 + int((i * 7) % (1 << bits)); });
      EXPECT_EQ(round_trip(t, n, x, 0x9).format, ExpFormat::kHuffman);
    }
}

// Values, message and output off 16-byte (and 8-, 4-, 2-byte) alignment: the
// split, merge and section kernels take their byte-wise paths, with the same bytes.
TEST(CudaLosslessSegments, UnalignedBuffers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : kTypes)
    for (uint32_t formats : {0xfu, 0x9u, 0x5u, 0x1u})
      for (size_t msg_off : {size_t(1), size_t(2), size_t(8)}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " formats " + std::to_string(formats) + " message offset " +
                     std::to_string(msg_off));
        const int64_t n = 2 * 1024 + 200 + 3;
        std::mt19937 g(static_cast<uint32_t>(msg_off + formats));
        const auto x = values_with(t, n, 21, [&](int64_t) {
          return bias(t) - 1 - int(std::min<uint32_t>(__builtin_ctz(g() | 0x100u), 7u));
        });
        round_trip(t, n, x, formats, msg_off, size_t(dtype_size(t)));
      }
}

}  // namespace
}  // namespace dynamiq
