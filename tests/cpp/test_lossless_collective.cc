// Mode "lossless" through the whole collective driver over the in-process
// transport: on every rank, the result is bit-identical to mode "none" with
// the same topology (world 2..5; ring, butterfly, two-step; sum and mean;
// bf16, fp16, fp32; Gaussian, heavy-tailed and adversarial inputs with NaN
// payloads, infinities, signed zeros, subnormals and overflowing sums), and
// every rank sends no more bytes than under "none".
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/base/float_bits.h"

namespace dynamiq {
namespace {

enum class Data { kGaussian, kHeavyTailed, kAdversarial };
const char* data_name(Data d) {
  return d == Data::kGaussian ? "gaussian" : d == Data::kHeavyTailed ? "heavy" : "adversarial";
}

uint32_t from_float(DType t, float f) {
  if (t == DType::kF32) return f32_bits(f);
  return t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
}

struct Buf {
  DType dtype;
  std::vector<uint8_t> bytes;
  int64_t n() const { return int64_t(bytes.size()) / dtype_size(dtype); }
  void set(int64_t i, uint32_t w) {
    std::memcpy(bytes.data() + i * dtype_size(dtype), &w, size_t(dtype_size(dtype)));
  }
};

std::vector<uint32_t> specials(DType t) {
  if (t == DType::kF32)
    return {0x80000000u, 0x00000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffc12345u,
            0x7f800001u, 0x7fffffffu, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x00400000u};
  if (t == DType::kBF16)
    return {0x8000u, 0x0000u, 0x7f80u, 0xff80u, 0x7fc1u, 0xffc5u,
            0x7f81u, 0x7fffu, 0x0001u, 0x807fu, 0x7f7fu, 0x0040u};
  return {0x8000u, 0x0000u, 0x7c00u, 0xfc00u, 0x7e01u, 0xfe05u,
          0x7c01u, 0x7fffu, 0x0001u, 0x83ffu, 0x7bffu, 0x0200u};
}

std::vector<Buf> inputs(DType t, Data kind, int world, int64_t n, uint32_t seed) {
  std::vector<Buf> x;
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::chi_squared_distribution<float> chi(2.f);
  const auto sp = specials(t);
  // Positions where every rank puts a special (NaN meets NaN, inf meets -inf, -0 meets -0).
  std::vector<int64_t> shared;
  for (int64_t i = 5; i < n; i += 97) shared.push_back(i);
  for (int r = 0; r < world; ++r) {
    Buf b{t, std::vector<uint8_t>(size_t(n * dtype_size(t)))};
    const float sigma = 1e-3f * float(1 + r);
    for (int64_t i = 0; i < n; ++i) {
      float v;
      if (kind == Data::kHeavyTailed)
        v = 1e-4f * nd(g) / std::sqrt(chi(g) / 2.f);  // Student t, 2 degrees of freedom
      else
        v = sigma * nd(g);
      b.set(i, from_float(t, v));
    }
    if (kind == Data::kAdversarial) {
      for (int64_t i = 0; i < n; i += 11) b.set(i, sp[g() % sp.size()]);
      for (int64_t i : shared) b.set(i, sp[(size_t(i) + size_t(r)) % sp.size()]);
      for (int64_t i = 3; i < n; i += 211) b.set(i, uint32_t(g()));  // random bit patterns
      // A run of -0.0 on every rank and a run of values whose sum overflows.
      for (int64_t i = 1000; i < 1100 && i < n; ++i) b.set(i, sp[0]);
      for (int64_t i = 2000; i < 2050 && i < n; ++i) b.set(i, sp[10]);
    }
    x.push_back(std::move(b));
  }
  return x;
}

// one_part: the transport accepts a message shorter than its receive (as Gloo
// does), so two-part messages travel as one. messages: set to the number of
// messages sent by all ranks.
std::vector<CallStats> run(Mode mode, Topology topo, ReduceOp op, int64_t block_bytes,
                           std::vector<Buf>& data, bool one_part = false, int64_t* messages = nullptr) {
  const int n = int(data.size());
  std::vector<CallStats> stats(static_cast<size_t>(n));
  CollectiveConfig cfg;
  cfg.mode = mode;
  cfg.topology = topo;
  cfg.block_bytes = block_bytes;
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_accepts_shorter_messages(one_part);
  world.run([&](int r, Transport& tr) {
    CallArgs a;
    a.data = data[size_t(r)].bytes.data();
    a.dtype = data[size_t(r)].dtype;
    a.numel = data[size_t(r)].n();
    a.op = op;
    stats[size_t(r)] = all_reduce(tr, cfg, a);
  });
  if (messages) *messages = world.messages_posted();
  return stats;
}

class LosslessCollective : public ::testing::TestWithParam<std::tuple<Topology, int>> {};

TEST_P(LosslessCollective, BitIdenticalToNoneOnEveryRankAndNeverMoreBytes) {
  const auto [topo, world] = GetParam();
  const int64_t numel = 9001;  // odd: partial units, a tail in the last block
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (Data kind : {Data::kGaussian, Data::kHeavyTailed, Data::kAdversarial})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + data_name(kind) +
                     (op == ReduceOp::kSum ? " sum" : " mean"));
        auto a = inputs(t, kind, world, numel, uint32_t(world * 1000 + int(kind) * 10 + int(t)));
        auto b = a;
        const int64_t block_bytes = 2048;  // many pipelined blocks per chunk
        auto sn = run(mode_id("none"), topo, op, block_bytes, a);
        auto sl = run(mode_id("lossless"), topo, op, block_bytes, b);
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(sl[size_t(r)].path, Path::kCompressed);
          ASSERT_EQ(sn[size_t(r)].path, Path::kExactMode);
          // Bit-identical to mode none on this rank (and none is identical across ranks).
          ASSERT_EQ(a[size_t(r)].bytes, a[0].bytes) << "none differs across ranks, rank " << r;
          if (b[size_t(r)].bytes != a[size_t(r)].bytes) {
            const int es = dtype_size(t);
            for (int64_t i = 0; i < numel; ++i)
              if (std::memcmp(&b[size_t(r)].bytes[size_t(i * es)], &a[size_t(r)].bytes[size_t(i * es)], size_t(es))) {
                uint32_t wl = 0, wn = 0;
                std::memcpy(&wl, &b[size_t(r)].bytes[size_t(i * es)], size_t(es));
                std::memcpy(&wn, &a[size_t(r)].bytes[size_t(i * es)], size_t(es));
                FAIL() << "rank " << r << " element " << i << ": lossless 0x" << std::hex << wl
                       << ", none 0x" << wn;
              }
          }
          EXPECT_LE(sl[size_t(r)].bytes_sent, sn[size_t(r)].bytes_sent) << "rank " << r;
          EXPECT_EQ(sl[size_t(r)].blocks, sn[size_t(r)].blocks) << "same blocks as none";
        }
      }
}

// On a transport that completes a receive with a shorter message (Gloo), each
// two-part message goes as one, its receive posted ahead for the largest size:
// the same results and bytes as the two-part posting, one transport message
// per codec message (the two-part posting sends a second one for every
// non-empty dynamic part).
TEST_P(LosslessCollective, OnePartMessagesGiveTheSameResultsWithFewerMessages) {
  const auto [topo, world] = GetParam();
  const int64_t numel = 9001;
  for (DType t : {DType::kBF16, DType::kF32})
    for (Data kind : {Data::kGaussian, Data::kAdversarial}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + data_name(kind));
      auto a = inputs(t, kind, world, numel, uint32_t(world * 1000 + int(kind) * 10 + int(t)));
      auto b = a;
      int64_t m2 = 0, m1 = 0;
      auto s2 = run(mode_id("lossless"), topo, ReduceOp::kSum, 2048, a, false, &m2);
      auto s1 = run(mode_id("lossless"), topo, ReduceOp::kSum, 2048, b, true, &m1);
      int64_t sent = 0;
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(b[size_t(r)].bytes, a[size_t(r)].bytes) << "rank " << r;
        EXPECT_EQ(s1[size_t(r)].bytes_sent, s2[size_t(r)].bytes_sent) << "rank " << r;
        EXPECT_EQ(s1[size_t(r)].messages_sent, s2[size_t(r)].messages_sent) << "rank " << r;
        sent += s1[size_t(r)].messages_sent;
      }
      EXPECT_EQ(m1, sent) << "one transport message per codec message";
      EXPECT_GT(m2, m1) << "the two-part posting sends second parts";
    }
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndTopologies, LosslessCollective,
    ::testing::Combine(::testing::ValuesIn(schedule_topologies()),
                       ::testing::Range(2, 6)),
    [](const auto& info) {
      return std::string(topology_name(std::get<0>(info.param))) + "_n" +
             std::to_string(std::get<1>(info.param));
    });

TEST(LosslessCollectiveBytes, GaussianBf16SendsAboutTwoThirdsOfNone) {
  // bf16 Gaussian: 8 sign/mantissa bits + ~2.6 bits of Huffman-coded exponent
  // + headers, i.e. <= 0.70 of none's bytes on every rank (ZipCCL's 3-bit
  // codes alone would give 0.6875 + escapes).
  for (Topology topo : {kTopologyRing, topology_id("butterfly")}) {
    const int world = 4;
    auto a = inputs(DType::kBF16, Data::kGaussian, world, 1 << 18, 99);
    auto b = a;
    auto sn = run(mode_id("none"), topo, ReduceOp::kSum, 256 * 1024, a);
    auto sl = run(mode_id("lossless"), topo, ReduceOp::kSum, 256 * 1024, b);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(b[size_t(r)].bytes, a[size_t(r)].bytes);
      EXPECT_LE(double(sl[size_t(r)].bytes_sent), 0.70 * double(sn[size_t(r)].bytes_sent))
          << topology_name(topo) << " rank " << r;
    }
  }
}

TEST(LosslessCollectiveBytes, IncompressibleDataCostsExactlyTheHeaderPerMessage) {
  // Uniformly random fp32 words (every exponent equally likely, NaNs and
  // infinities included): every block goes plain, raw bytes + the 16-byte
  // header. A fixed-size static part cannot do better (lossless_format.h).
  // Each rank sends at most 2 messages per block of the table (ring,
  // butterfly and two-step all do), so the excess is 16 * k with k <= 2 * blocks.
  for (Topology topo : schedule_topologies()) {
    const int world = 3;
    std::mt19937 g(42);
    std::vector<Buf> a;
    for (int r = 0; r < world; ++r) {
      Buf b{DType::kF32, std::vector<uint8_t>(size_t(20000) * 4)};
      for (int64_t i = 0; i < 20000; ++i) b.set(i, uint32_t(g()));
      a.push_back(std::move(b));
    }
    auto b = a;
    auto sn = run(mode_id("none"), topo, ReduceOp::kSum, 8192, a);
    auto sl = run(mode_id("lossless"), topo, ReduceOp::kSum, 8192, b);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(b[size_t(r)].bytes, a[size_t(r)].bytes);
      const int64_t extra = sl[size_t(r)].bytes_sent - sn[size_t(r)].bytes_sent;
      EXPECT_GT(extra, 0);
      EXPECT_EQ(extra % 16, 0);
      EXPECT_LE(extra / 16, 2 * sl[size_t(r)].blocks) << topology_name(topo) << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace dynamiq
