// LosslessCudaCodec's decode of a received message (lossless_cuda_codec.cu):
// parsed, checked and decoded on the device with no copy to the host; a
// malformed message raises MalformedMessage from finish(), in the CPU
// decoder's words, and leaves the output untouched. The CPU decoder is the oracle (bit for bit).
// Runs on a GPU, and in CI on the CPU emulation of CUDA (tests/cpp/cuda_emu),
// which also counts the device-to-host copies.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
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
// into a device bucket first filled with 0xa5, then its finish() (where a
// refusal is raised); returns the bucket. probe(0), probe(1), probe(2) run
// before the decompress, between it and finish(), and after finish().
std::vector<uint8_t> gpu_decode(const cuda::LosslessCudaCodec& gpu, const std::vector<uint8_t>& msg, DType t,
                                int64_t n, const std::function<void(int)>& probe = nullptr) {
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
  if (probe) probe(0);
  try {
    gpu.decompress(din.p, msg.size(), plan, b, y);
    if (probe) probe(1);
    gpu.finish();
  } catch (...) {
    if (probe) probe(2);
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(cudaMemcpy(out.data(), dy.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(out, std::vector<uint8_t>(bytes, 0xa5)) << "a refused message must leave the output untouched";
    throw;
  }
  if (probe) probe(2);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(cudaMemcpy(out.data(), dy.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// The codec's fused hop (decompress, add the local values x, recompress) on msg;
// returns the MalformedMessage text the hop call itself raised ("" if none),
// and checks that finish() then has nothing left to raise.
std::string gpu_hop(const cuda::LosslessCudaCodec& gpu, const std::vector<uint8_t>& msg,
                    const std::vector<uint8_t>& x, DType t, int64_t n) {
  const Plan plan = make_lossless_plan(t, n, 1);
  Block b;
  b.w1 = plan.num_units;
  DevBuf din(msg.size()), dx(x.size()), dout(lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n));
  EXPECT_EQ(cudaMemcpy(din.p, msg.data(), msg.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dx.p, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Local lx;
  lx.bucket = dx.p;
  std::string what;
  try {
    gpu.decompress_accumulate_recompress(din.p, msg.size(), lx, plan, b, RngCtx{}, dout.p);
  } catch (const MalformedMessage& e) {
    what = e.what();
  }
  EXPECT_NO_THROW(gpu.finish()) << "the hop's refusal must not be raised twice";
  return what;
}

// The MalformedMessage text of a call ("" if it did not raise one).
std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const MalformedMessage& e) {
    return e.what();
  }
  return "";
}

// What the GPU decode must say of a message the CPU decoder refused with
// `cpu`: the same words for whatever the parse refuses; a segment's invalid
// codes (found by the section decoders, which say no more) in its own words.
std::string gpu_words(const std::string& cpu) {
  if (cpu.find("invalid Huffman code stream") != std::string::npos ||
      cpu.find("zip escape codes disagree") != std::string::npos)
    return cpu.substr(0, cpu.find("lossless: ")) + "lossless: invalid exponent codes in a segment (GPU decode)";
  return cpu + " (GPU decode)";
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

// A case's n values (x) and their CPU-encoded message (the callers assert its format).
struct CaseMessage {
  std::vector<uint8_t> x, msg;
};
CaseMessage case_message(const Case& c, int64_t n, uint32_t seed) {
  CaseMessage m;
  m.x = lossless_values(c.t, n, c.kind, seed);
  m.msg = encode(m.x, c.t, n, c.formats);
  return m;
}

// Every format and dtype, 1 MiB of raw values plus a 5-value tail: the GPU
// decode gives the input bit for bit (the CPU decoder agrees).
TEST(CudaLosslessDecode, EveryFormatDecodesBitForBitLikeTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const cuda::LosslessCudaCodec gpu;
  for (const Case& c : kCases) {
    const int64_t n = (int64_t(1) << 20) / dtype_size(c.t) + 5;
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + lossless::exp_format_name(c.want));
    const auto [x, msg] = case_message(c, n, 17);
    ASSERT_EQ(lossless_format_of(msg.data()), c.want);
    std::vector<uint8_t> cpu(x.size());
    lossless_decode(msg.data(), msg.size(), c.t, n, cpu.data());
    ASSERT_EQ(cpu, x);
    EXPECT_EQ(gpu_decode(gpu, msg, c.t, n), x);
  }
}

#if defined(DYNAMIQ_CUDA_EMULATION)
// Host waits (cuda*Synchronize) in the emulation's API log.
size_t logged_waits() {
  size_t w = 0;
  for (const auto& call : dynamiq_cuda_emu::api_log()) w += std::string(call.name).find("Synchronize") != std::string::npos;
  return w;
}

// The decode parses and checks the message on the device: no copy to the host
// and no wait during the decompress (the message is >= 256 KiB here, 1 MiB
// for plain); finish() copies the 24-byte refusal record once and waits once.
TEST(CudaLosslessDecode, DecodeNeitherCopiesToTheHostNorWaitsFinishWaitsOnce) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const cuda::LosslessCudaCodec gpu;
  for (const Case& c : kCases) {
    const int64_t n = (int64_t(1) << 20) / dtype_size(c.t) + 5;
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + lossless::exp_format_name(c.want));
    const auto [x, msg] = case_message(c, n, 23);
    ASSERT_EQ(lossless_format_of(msg.data()), c.want);
    ASSERT_GT(msg.size(), size_t(256) << 10);
    dynamiq_cuda_emu::CopyCounts counts[2];
    size_t waits[2] = {0, 0};
    const auto y = gpu_decode(gpu, msg, c.t, n, [&](int stage) {
      if (stage > 0) {
        counts[stage - 1] = dynamiq_cuda_emu::copy_counts();
        waits[stage - 1] = logged_waits();
      }
      dynamiq_cuda_emu::reset_copy_counts();
      dynamiq_cuda_emu::set_api_log(stage < 2);
    });
    EXPECT_EQ(y, x);
    EXPECT_EQ(counts[0].d2h_copies, 0u);
    EXPECT_EQ(waits[0], 0u);
    EXPECT_EQ(counts[1].d2h_copies, 1u);
    EXPECT_EQ(counts[1].d2h_bytes, sizeof(lossless::Fault));
    EXPECT_EQ(waits[1], 1u);
  }
}

// The encode (compress) is enqueued whole -- the format is chosen on the
// device -- and waits once, for one copy of the codec's record (the size and
// the refusals so far, at most 32 bytes): one wait and one copy per message
// whatever the format, and the message is the CPU encoder's, byte for byte.
// So is a fused hop's (decode, add, encode): the decode adds no wait.
TEST(CudaLosslessDecode, CompressAndFusedHopWaitOncePerMessage) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const Case& c : kCases) {
    LosslessOptions opt;
    opt.formats = c.formats;
    const cuda::LosslessCudaCodec gpu(opt);
    const int64_t n = (int64_t(1) << 18) / dtype_size(c.t) + 5;
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + lossless::exp_format_name(c.want));
    const auto [x, want] = case_message(c, n, 41);
    ASSERT_EQ(lossless_format_of(want.data()), c.want);
    const Plan plan = make_lossless_plan(c.t, n, 1);
    Block b;
    b.w1 = plan.num_units;
    const size_t cap = lossless_static_bytes(c.t, n) + lossless_max_dynamic_bytes(c.t, n);
    DevBuf dx(x.size()), dout(cap), din(want.size());
    ASSERT_EQ(cudaMemcpy(dx.p, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(din.p, want.data(), want.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Local lx;
    lx.bucket = dx.p;
    for (const bool hop : {false, true}) {
      SCOPED_TRACE(hop ? "fused hop" : "compress");
      dynamiq_cuda_emu::reset_copy_counts();
      dynamiq_cuda_emu::set_api_log(true);
      const size_t bytes = hop ? gpu.decompress_accumulate_recompress(din.p, want.size(), lx, plan, b, RngCtx{}, dout.p)
                               : gpu.compress(lx, plan, b, RngCtx{}, dout.p);
      const auto counts = dynamiq_cuda_emu::copy_counts();
      const size_t waits = logged_waits();
      dynamiq_cuda_emu::set_api_log(false);
      EXPECT_EQ(counts.d2h_copies, 1u);
      EXPECT_LE(counts.d2h_bytes, 32u);
      EXPECT_EQ(waits, 1u);
      ASSERT_NO_THROW(gpu.finish());
      // the hop sends the sum of the message's values and x: 2x, whose message the CPU writes
      std::vector<uint8_t> expect = want;
      if (hop) {
        const LosslessCodec cpu(opt);
        std::vector<uint8_t> m(cap);
        m.resize(cpu.decompress_accumulate_recompress(want.data(), want.size(), Local{x.data()}, plan, b, RngCtx{},
                                                      m.data()));
        expect = m;
      }
      ASSERT_EQ(bytes, expect.size());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> got(bytes);
      ASSERT_EQ(cudaMemcpy(got.data(), dout.p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, expect);
    }
  }
}
#endif

// A message corrupted so that the parse refuses it (header, sizes, tables,
// per-segment sizes) or the kernels do (codes): the device path raises
// MalformedMessage as the CPU decoder does, and writes nothing; a fused hop
// raises from the call itself.
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
    const std::string cpu = refusal([&] { lossless_decode(b.msg.data(), b.msg.size(), t, n, y.data()); });
    ASSERT_FALSE(cpu.empty());
    EXPECT_EQ(refusal([&] { gpu_decode(gpu, b.msg, t, n); }), gpu_words(cpu));
    // a fused hop raises at once, in its encode's wait: nothing is forwarded
    EXPECT_EQ(gpu_hop(gpu, b.msg, x, t, n), gpu_words(cpu));
  }
  EXPECT_EQ(gpu_hop(gpu, huff, x, t, n), "");
  // and the codec still decodes a good message afterwards
  EXPECT_EQ(gpu_decode(gpu, huff, t, n), x);
}

}  // namespace
}  // namespace dynamiq

namespace dynamiq {
namespace {

// Random corruption of the bytes the parse reads (header, tables, segment
// sizes), of the payload, and of the size: the device parse refuses exactly
// what the CPU decoder refuses, in the same words, and what both accept
// decodes to the same values. Every format, all three dtypes.
TEST(CudaLosslessDecode, RandomCorruptionsAreRefusedExactlyAsOnTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const cuda::LosslessCudaCodec gpu;
  std::mt19937 rng(2026);
  int refused = 0, accepted = 0;
  for (const Case& c : kCases) {
    const int64_t n = 9000 + 3;  // 1125 groups, 9 segments, a 3-value tail
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " " + lossless::exp_format_name(c.want));
    const auto [x, msg] = case_message(c, n, 31);
    ASSERT_EQ(lossless_format_of(msg.data()), c.want);
    const size_t st = lossless_static_bytes(c.t, n);
    const size_t parsed = std::min(msg.size() - st, lossless_parse_prefix_bytes(c.t, n));
    for (int trial = 0; trial < 24; ++trial) {
      std::vector<uint8_t> m = msg;
      const int how = int(rng() % 6);
      const int flips = 1 + int(rng() % 3);
      for (int i = 0; i < flips; ++i) {
        size_t at;
        if (how == 0) at = rng() % lossless::kHeaderBytes;
        else if (how <= 2) at = st + rng() % std::max<size_t>(parsed, 1);
        else at = rng() % m.size();
        m[at] ^= uint8_t(1u << (rng() % 8));
      }
      if (how == 5) {  // and a size off by a few bytes
        if (rng() % 2) m.resize(m.size() - 1 - rng() % 4);
        else m.resize(m.size() + 1 + rng() % 4, uint8_t(rng()));
      }
      SCOPED_TRACE("trial " + std::to_string(trial));
      std::vector<uint8_t> y(x.size());
      const std::string cpu = refusal([&] { lossless_decode(m.data(), m.size(), c.t, n, y.data()); });
      std::vector<uint8_t> g;
      const std::string got = refusal([&] { g = gpu_decode(gpu, m, c.t, n); });
      if (cpu.empty()) {
        ++accepted;
        EXPECT_EQ(got, "");
        EXPECT_EQ(g, y);
      } else {
        ++refused;
        EXPECT_EQ(got, gpu_words(cpu));
      }
    }
  }
  // both outcomes occur (payload flips of plain sections decode to other values)
  EXPECT_GT(refused, 50);
  EXPECT_GT(accepted, 10);
}

}  // namespace
}  // namespace dynamiq
