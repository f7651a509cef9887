// LosslessCudaCodec's decode of a received message (lossless_cuda_codec.cu):
// the host reads only the header and the section's tables, the kernels read
// the payload in place, and a malformed message raises MalformedMessage and
// leaves the output untouched. The CPU decoder is the oracle (bit for bit).
// Runs on a GPU, and in CI on the CPU emulation of CUDA (tests/cpp/cuda_emu),
// which also counts the device-to-host copies.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/lossless/cuda/lossless_cuda_codec.h"
#include "lossless_test_values.h"

namespace dynamiq {
namespace {

using lossless::ExpFormat;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct DevBuf {
  uint8_t* p = nullptr;
  explicit DevBuf(size_t n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n ? n : 1), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
};

using dqtest::lossless_values;

std::vector<uint8_t> encode(const std::vector<uint8_t>& x, DType t, int64_t n, uint32_t formats) {
  LosslessOptions opt;
  opt.formats = formats;
  std::vector<uint8_t> msg(lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n));
  msg.resize(lossless_encode(x.data(), t, n, msg.data(), opt));
  return msg;
}

// The codec's decompress of msg (copied to a device buffer of exactly its size)
// into a device bucket first filled with 0xa5; returns the bucket. before/after
// run just before and after the codec's call.
std::vector<uint8_t> gpu_decode(const cuda::LosslessCudaCodec& gpu, const std::vector<uint8_t>& msg, DType t,
                                int64_t n, const std::function<void()>& before = nullptr,
                                const std::function<void()>& after = nullptr) {
  const Plan plan = make_lossless_plan(t, n, 1);
  Block b;
  b.w1 = plan.num_units;
  const size_t bytes = size_t(n) * size_t(dtype_size(t));
  DevBuf din(msg.size()), dy(bytes);
  EXPECT_EQ(cudaMemcpy(din.p, msg.data(), msg.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(dy.p, 0xa5, bytes), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Output y;
  y.bucket = dy.p;
  if (before) before();
  try {
    gpu.decompress(din.p, msg.size(), plan, b, y);
  } catch (...) {
    if (after) after();
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(cudaMemcpy(out.data(), dy.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(out, std::vector<uint8_t>(bytes, 0xa5)) << "a refused message must leave the output untouched";
    throw;
  }
  if (after) after();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(cudaMemcpy(out.data(), dy.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

struct Case {
  DType t;
  int kind;  // of lossless_values: 0 Gaussian, 2 all 1.5 (one exponent)
  uint32_t formats;
  ExpFormat want;
};

const Case kCases[] = {
    {DType::kBF16, 0, 0x9, ExpFormat::kHuffman}, {DType::kBF16, 0, 0x5, ExpFormat::kZip},
    {DType::kBF16, 0, 0x1, ExpFormat::kPlain},   {DType::kBF16, 2, 0xf, ExpFormat::kConst},
    {DType::kF16, 0, 0x9, ExpFormat::kHuffman},  {DType::kF16, 0, 0x5, ExpFormat::kZip},
    {DType::kF16, 0, 0x1, ExpFormat::kPlain},    {DType::kF32, 0, 0x9, ExpFormat::kHuffman},
    {DType::kF32, 0, 0x5, ExpFormat::kZip},      {DType::kF32, 0, 0x1, ExpFormat::kPlain},
};

// Every format and dtype, 1 MiB of raw values plus a 5-value tail: the GPU
// decode gives the input bit for bit (the CPU decoder agrees).
TEST(CudaLosslessDecode, EveryFormatDecodesBitForBitLikeTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const cuda::LosslessCudaCodec gpu;
  for (const Case& c : kCases) {
    const int64_t n = (int64_t(1) << 20) / dtype_size(c.t) + 5;
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + lossless::exp_format_name(c.want));
    const auto x = lossless_values(c.t, n, c.kind, 17);
    const auto msg = encode(x, c.t, n, c.formats);
    ASSERT_EQ(lossless_format_of(msg.data()), c.want);
    std::vector<uint8_t> cpu(x.size());
    lossless_decode(msg.data(), msg.size(), c.t, n, cpu.data());
    ASSERT_EQ(cpu, x);
    EXPECT_EQ(gpu_decode(gpu, msg, c.t, n), x);
  }
}

#if defined(DYNAMIQ_CUDA_EMULATION)
// The decode copies to the host only the header and the section's tables
// (<= 16 + 385 + 2 bytes per 1024-value segment: 1425 bytes for 1 MiB of
// bf16), in one copy, plus the 4-byte error flag of the section kernels:
// never the message body (>= 256 KiB here, 1 MiB for plain), and at most
// two waits.
TEST(CudaLosslessDecode, OnlyTheHeaderAndTablesAreCopiedToTheHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const cuda::LosslessCudaCodec gpu;
  for (const Case& c : kCases) {
    const int64_t n = (int64_t(1) << 20) / dtype_size(c.t) + 5;
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + lossless::exp_format_name(c.want));
    const auto x = lossless_values(c.t, n, c.kind, 23);
    const auto msg = encode(x, c.t, n, c.formats);
    ASSERT_EQ(lossless_format_of(msg.data()), c.want);
    ASSERT_GT(msg.size(), size_t(256) << 10);
    dynamiq_cuda_emu::CopyCounts counts;
    size_t waits = 0;
    const auto y = gpu_decode(
        gpu, msg, c.t, n,
        [] {
          dynamiq_cuda_emu::reset_copy_counts();
          dynamiq_cuda_emu::set_api_log(true);
        },
        [&] {
      counts = dynamiq_cuda_emu::copy_counts();
      for (const auto& call : dynamiq_cuda_emu::api_log())
        waits += std::string(call.name).find("Synchronize") != std::string::npos;
      dynamiq_cuda_emu::set_api_log(false);
    });
    EXPECT_EQ(y, x);
    EXPECT_LT(counts.d2h_bytes, 4096u);
    EXPECT_LE(counts.d2h_copies, 2u);
    EXPECT_LE(waits, 2u);
  }
}
#endif

// A message corrupted so that the parse refuses it (header, sizes, tables,
// per-segment sizes) or the kernels do (codes): the device path raises
// MalformedMessage as the CPU decoder does, and writes nothing.
TEST(CudaLosslessDecode, MalformedMessagesAreRefusedOnTheDevicePath) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const cuda::LosslessCudaCodec gpu;
  const DType t = DType::kBF16;
  const int64_t n = 40000 + 3;  // 5000 groups, 40 segments, a 3-value tail
  const auto x = lossless_values(t, n, 0, 5);
  const lossless::Layout L = lossless::make_layout(t, n);
  const size_t st = size_t(L.static_bytes), S = size_t(L.segments);
  const auto huff = encode(x, t, n, 0x9), zip = encode(x, t, n, 0x5), cnst = encode(lossless_values(t, n, 2, 5), t, n, 0x3);
  ASSERT_EQ(lossless_format_of(huff.data()), ExpFormat::kHuffman);
  ASSERT_EQ(lossless_format_of(zip.data()), ExpFormat::kZip);
  ASSERT_EQ(lossless_format_of(cnst.data()), ExpFormat::kConst);
  const int k = huff[st] + 1;
  const size_t huff_meta = st + 1 + size_t(k) + size_t(k + 1) / 2;  // per-segment stream sizes
  const size_t zip_meta = st + 8;                                    // per-segment escape counts

  struct Bad {
    std::string what;
    std::vector<uint8_t> msg;
  };
  std::vector<Bad> bad;
  auto with = [&](const std::string& what, std::vector<uint8_t> m, const std::function<void(std::vector<uint8_t>&)>& f) {
    f(m);
    bad.push_back({what, std::move(m)});
  };
  with("truncated to 10 bytes", huff, [](auto& m) { m.resize(10); });
  with("truncated inside the static part", huff, [&](auto& m) { m.resize(st - 1); });
  with("one byte short of the announced size", huff, [](auto& m) { m.pop_back(); });
  with("one byte past the announced size", zip, [](auto& m) { m.push_back(0); });
  with("header byte flipped (CRC)", huff, [](auto& m) { m[5] ^= 0x01; });
  with("Huffman symbol count beyond the alphabet", huff, [&](auto& m) { m[st] = 0xff; });
  with("Huffman symbols not increasing", huff, [&](auto& m) { std::swap(m[st + 1], m[st + 2]); });
  with("Huffman code length 0", huff, [&](auto& m) { m[st + 1 + size_t(k)] &= 0xf0; });
  with("Huffman code lengths over-subscribed", huff, [&](auto& m) {
    for (int i = 0; i < (k + 1) / 2; ++i) m[st + 1 + size_t(k) + size_t(i)] = 0x11;
  });
  with("Huffman segment size +1", huff, [&](auto& m) { m[huff_meta] += 1; });
  with("Huffman stream byte moved from segment 0 to 1", huff, [&](auto& m) {
    // same total: the parse passes, the kernels find segment 0 too short
    store_u16(m.data() + huff_meta, uint16_t(load_u16(m.data() + huff_meta) - 1));
    store_u16(m.data() + huff_meta + 2, uint16_t(load_u16(m.data() + huff_meta + 2) + 1));
  });
  with("Huffman last segment size 0xffff", huff, [&](auto& m) {
    m[huff_meta + 2 * (S - 1)] = 0xff;
    m[huff_meta + 2 * (S - 1) + 1] = 0xff;
  });
  with("Huffman segment 0's stream zeroed", huff, [&](auto& m) {
    // every code reads as the shortest one: segment 0 ends before its announced size
    const size_t s0 = huff_meta + 2 * S;
    std::fill(m.begin() + long(s0), m.begin() + long(s0 + load_u16(m.data() + huff_meta)), uint8_t(0));
  });
  with("zip table padding not zero", zip, [&](auto& m) { m[st + 7] = 1; });
  with("zip escape count +1", zip, [&](auto& m) {
    store_u16(m.data() + zip_meta, uint16_t(load_u16(m.data() + zip_meta) + 1));
  });
  with("zip escape moved from segment 1 to 0", zip, [&](auto& m) {
    store_u16(m.data() + zip_meta, uint16_t(load_u16(m.data() + zip_meta) + 1));
    store_u16(m.data() + zip_meta + 2, uint16_t(load_u16(m.data() + zip_meta + 2) - 1));
  });
  with("zip escape count beyond its segment", zip, [&](auto& m) {
    m[zip_meta] = 0xff;
    m[zip_meta + 1] = 0xff;
  });
  with("const exponent, format byte says zip (CRC redone)", cnst, [&](auto& m) {
    m[3] = uint8_t(ExpFormat::kZip);
    const uint16_t c = lossless::crc16(m.data(), 14);
    std::memcpy(m.data() + 14, &c, 2);
  });

  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    std::vector<uint8_t> y(x.size());
    EXPECT_THROW(lossless_decode(b.msg.data(), b.msg.size(), t, n, y.data()), MalformedMessage);
    EXPECT_THROW(gpu_decode(gpu, b.msg, t, n), MalformedMessage);
  }
  // and the codec still decodes a good message afterwards
  EXPECT_EQ(gpu_decode(gpu, huff, t, n), x);
}

}  // namespace
}  // namespace dynamiq
