// The test-only "negate" codec (negate_codec.h), registered from this folder
// with one line, runs through the collective driver like a built-in mode:
// every topology, 1 to 8 ranks, exact sums on every rank, the same bits as
// mode none, and its own bytes on the wire.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/base/float_bits.h"
#include "kernels/registry.h"
#include "negate_codec.h"

namespace dynamiq {
namespace negate_test {
namespace {

TEST(NegateCodec, IsRegisteredUnderItsNameAndId) {
  // (the registration line is negate_codec.cc's, a static initialiser of the folder's code)
  EXPECT_EQ(mode_id("negate"), Mode(200));
  EXPECT_STREQ(mode_name(Mode(200)), "negate");
  CollectiveConfig c;
  c.mode = mode_id("negate");
  const auto s = make_scheme(c);
  EXPECT_EQ(s->codec().name(), "negate");
  EXPECT_EQ(s->mode(), Mode(200));
  EXPECT_EQ(dynamic_cast<const NegateCodec&>(s->codec()).mask(), 0x80) << "the declared default";
  // the declaration's check, naming the mode's parameters; then the factory's own
  c.params.set("group_size", 16.0);
  try {
    make_scheme(c);
    ADD_FAILURE() << "group_size accepted by mode negate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group_size is not a parameter of mode 'negate' (its parameters: mask)"),
              std::string::npos) << e.what();
  }
  c.params.clear();
  c.params.set("mask", 256.0);
  EXPECT_THROW(make_scheme(c), Error);
  c.params.set("mask", 0.0);
  EXPECT_THROW(make_scheme(c), Error);
  c.params.set("mask", 1.0);
  EXPECT_EQ(dynamic_cast<const NegateCodec&>(make_scheme(c)->codec()).mask(), 1);
}

// The parameter is the codec's, declared in this folder, and it reaches the fingerprint (by
// name: it is not one of version 1's), so ranks that disagree on it are stopped.
TEST(NegateCodec, ItsParameterEntersTheFingerprint) {
  CollectiveConfig a, b;
  a.mode = b.mode = mode_id("negate");
  b.params.set("mask", 128.0);
  EXPECT_EQ(a.fingerprint(), b.fingerprint()) << "the default, given or not";
  b.params.set("mask", 127.0);
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

// The bytes of a block are -x, and decompress gives x back.
TEST(NegateCodec, SendsMinusXAndNegatesBack) {
  const int64_t numel = 1000;
  std::vector<float> x(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) x[size_t(i)] = float(i) - 500.25f;
  const NegateCodec codec;
  const Plan plan = make_identity_plan(DType::kF32, numel, 1);
  const Block b{0, plan.num_units};
  Local local;
  local.bucket = x.data();
  std::vector<uint8_t> wire(codec.static_bytes(plan, b));
  ASSERT_EQ(codec.compress(local, plan, b, RngCtx(), wire.data()), wire.size());
  ASSERT_EQ(wire.size(), size_t(numel) * 4);
  for (int64_t i = 0; i < numel; ++i) {
    float v;
    std::memcpy(&v, wire.data() + 4 * i, 4);
    ASSERT_EQ(v, -x[size_t(i)]) << i;
  }
  std::vector<float> y(size_t(numel), 0.f);
  Output out;
  out.bucket = y.data();
  codec.decompress(wire.data(), wire.size(), plan, b, out);
  EXPECT_EQ(y, x);
}

// All ranks all-reduce `x` (raw bucket bytes per rank) with `cfg` over the in-process transport.
std::vector<CallStats> all_reduce_all(int n, const CollectiveConfig& cfg, DType dtype, ReduceOp op,
                                      std::vector<std::vector<uint8_t>>& x) {
  std::vector<CallStats> stats(static_cast<size_t>(n));
  InprocWorld world(n, std::chrono::seconds(60));
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = x[size_t(r)].data();
    a.dtype = dtype;
    a.numel = int64_t(x[size_t(r)].size()) / dtype_size(dtype);
    a.op = op;
    a.seq = 7;
    stats[size_t(r)] = all_reduce(t, cfg, a);
  });
  return stats;
}

class NegateCollective : public ::testing::TestWithParam<std::tuple<Topology, int>> {};

// Integer-valued float32 inputs: every partial sum is exact, so every rank
// must hold exactly the elementwise sum, whatever the order of the hops.
TEST_P(NegateCollective, SumsExactlyOnEveryRank) {
  const auto [topo, n] = GetParam();
  const int64_t numel = 10007;  // > min_compress_numel, a partial last unit
  std::mt19937 g(uint32_t(100 * n + int(topo)));
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<std::vector<uint8_t>> x(size_t(n), std::vector<uint8_t>(size_t(numel) * 4));
  std::vector<float> ref(size_t(numel), 0.f);
  for (auto& v : x)
    for (int64_t i = 0; i < numel; ++i) {
      const float e = float(d(g));
      std::memcpy(v.data() + 4 * i, &e, 4);
      ref[size_t(i)] += e;
    }
  CollectiveConfig cfg;
  cfg.mode = mode_id("negate");
  cfg.topology = topo;
  cfg.block_bytes = 4096;  // several blocks per chunk
  const int64_t before = NegateCodec::messages_encoded();
  const std::vector<CallStats> st = all_reduce_all(n, cfg, DType::kF32, ReduceOp::kSum, x);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(st[size_t(r)].path, n == 1 ? Path::kExactMode : Path::kCompressed) << "rank " << r;
    for (int64_t i = 0; i < numel; ++i) {
      float v;
      std::memcpy(&v, x[size_t(r)].data() + 4 * i, 4);
      ASSERT_EQ(v, ref[size_t(i)]) << topology_name(topo) << " n=" << n << " rank " << r << " i=" << i;
    }
  }
  if (n > 1) {
    EXPECT_GT(NegateCodec::messages_encoded(), before) << "the negate codec did not run";
  }
}

// Random bf16 and float32 inputs, mean: the same bits as mode none on every rank.
TEST_P(NegateCollective, MatchesModeNoneBitForBit) {
  const auto [topo, n] = GetParam();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t numel = 6000;
    const size_t es = size_t(dtype_size(dtype));
    std::mt19937 g(static_cast<uint32_t>(n));
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<std::vector<uint8_t>> a(size_t(n), std::vector<uint8_t>(size_t(numel) * es));
    for (auto& v : a)
      for (int64_t i = 0; i < numel; ++i) {
        const float e = d(g);
        if (dtype == DType::kF32) {
          std::memcpy(v.data() + 4 * i, &e, 4);
        } else {
          const uint16_t h = f32_to_bf16(e);
          std::memcpy(v.data() + 2 * i, &h, 2);
        }
      }
    std::vector<std::vector<uint8_t>> b = a;
    CollectiveConfig cfg;
    cfg.topology = topo;
    cfg.block_bytes = 2048;
    all_reduce_all(n, cfg, dtype, ReduceOp::kMean, a);  // mode none
    cfg.mode = mode_id("negate");
    all_reduce_all(n, cfg, dtype, ReduceOp::kMean, b);
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(a[size_t(r)], b[size_t(r)]) << topology_name(topo) << " n=" << n << " " << dtype_name(dtype)
                                          << " rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryTopology, NegateCollective,
    ::testing::Combine(::testing::ValuesIn(schedule_topologies()),
                       ::testing::Range(1, 9)),
    [](const auto& info) {
      return std::string(topology_name(std::get<0>(info.param))) + "_n" + std::to_string(std::get<1>(info.param));
    });

}  // namespace
}  // namespace negate_test
}  // namespace dynamiq
