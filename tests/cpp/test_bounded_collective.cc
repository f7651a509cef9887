// Mode "bounded" through the collective driver over the in-process
// transport, every topology, 2 to 8 ranks: every coordinate of the result is
// within k x e of the exact sum, k = bounded_compressions(kind, world) (the
// compressions on the coordinate's path, counted here from the schedules
// themselves: every partial sum compressed once per hop, an all-reduce's
// final sum compressed once and forwarded as bytes, a reduce-scatter's kept as
// it is); every rank ends bit-identical;
// a relative bound resolves to the same e everywhere; non-finite input takes
// the exact path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/schedule.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/base/float_bits.h"
#include "kernels/bounded/bounded_codec.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

// Compressions per block, summed over every rank's program: the roles that
// run the codec's compress (leaf, fused middle hop, sink, own final shard),
// except a reduce-scatter's sink, which in a lossy mode writes its sum as it
// is (ExecArgs::sink_writes_sum). In a reduction every compression's error
// stays in the sum, so this is the number of errors that add up in a
// coordinate of the result.
std::map<int, int> compressions_per_block(Topology t, int world, Collective kind) {
  Plan plan = make_identity_plan(DType::kF32, int64_t(world) * 64 * 256, topology_chunks(t, world, kind));
  const BlockTable bt = make_blocks(plan, 8 * 1024);
  std::map<int, int> count;
  for (int r = 0; r < world; ++r)
    for (const Op& op : make_program(t, r, world, bt, kind).ops)
      switch (op.role) {
        case Role::kSendLeaf: case Role::kRecvDAR: case Role::kLocalSink: case Role::kLocalFinal:
          ++count[op.block];
          break;
        case Role::kRecvSink:
          if (kind != Collective::kReduceScatter) ++count[op.block];
          break;
        default:
          break;
      }
  return count;
}

TEST(BoundedCollective, CompressionsPerCoordinateMatchTheDocumentedCount) {
  for (Collective kind : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather})
    for (Topology t : schedule_topologies(kind))
      for (int n = 2; n <= 9; ++n) {
        const auto c = compressions_per_block(t, n, kind);
        ASSERT_FALSE(c.empty());
        for (const auto& [blk, k] : c)
          EXPECT_EQ(k, bounded_compressions(int(kind), n))
              << topology_name(t) << " " << collective_name(kind) << " n=" << n << " block " << blk;
      }
}

CollectiveConfig bounded_cfg(Topology t, double e, double rel = 0.0) {
  CollectiveConfig c;
  c.mode = mode_id("bounded");
  c.topology = t;
  if (e != 0.0) c.params.set("error_bound", e);  // exactly one of the two is given
  if (rel != 0.0) c.params.set("error_bound_rel", rel);
  c.block_bytes = 16 * 1024;  // several blocks per chunk
  return c;
}

struct World {
  std::vector<std::vector<float>> out;
  std::vector<CallStats> stats;
};

World run(int n, const CollectiveConfig& cfg, const std::vector<std::vector<float>>& in,
          ReduceOp op = ReduceOp::kSum) {
  World w;
  w.out = in;
  w.stats.resize(size_t(n));
  InprocWorld world(n, std::chrono::seconds(120));
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = w.out[size_t(r)].data();
    a.dtype = DType::kF32;
    a.numel = int64_t(w.out[size_t(r)].size());
    a.op = op;
    a.seq = 3;
    w.stats[size_t(r)] = all_reduce(t, cfg, a);
  });
  return w;
}

// Smooth (random walk) plus noise on a grid of 2^-8, |x| < 64: every float32
// sum of up to 8 of them, and of decoded values (multiples of a power-of-two
// w >= 2^-8), is exact, so the only error left is the codec's.
std::vector<std::vector<float>> grid_data(int n, int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> step(-3, 3), noise(-40, 40);
  std::vector<std::vector<float>> x(size_t(n), std::vector<float>(static_cast<size_t>(numel)));
  for (auto& v : x) {
    int walk = 0;
    for (int64_t i = 0; i < numel; ++i) {
      walk += step(g);
      if (walk > 8000 || walk < -8000) walk /= 2;
      v[size_t(i)] = float(walk + (i % 3 == 0 ? noise(g) : 0)) * 0x1p-8f;
    }
  }
  return x;
}

std::vector<double> exact_sum(const std::vector<std::vector<float>>& x) {
  std::vector<double> s(x[0].size(), 0.0);
  for (const auto& v : x)
    for (size_t i = 0; i < v.size(); ++i) s[i] += double(v[i]);
  return s;
}

void expect_identical(const World& w, const char* what) {
  for (size_t r = 1; r < w.out.size(); ++r)
    ASSERT_EQ(0, std::memcmp(w.out[r].data(), w.out[0].data(), w.out[0].size() * 4)) << what << ": rank " << r;
}

class BoundedTopo : public ::testing::TestWithParam<std::tuple<Topology, int>> {};

// Power-of-two bounds on grid data: no float rounding anywhere but the
// codec's, so the bound k x e must hold exactly.
TEST_P(BoundedTopo, SumWithinCompressionsTimesBoundExactly) {
  const auto [t, n] = GetParam();
  const int64_t numel = 30011;
  const auto x = grid_data(n, numel, uint32_t(7 * n + int(t)));
  const auto ref = exact_sum(x);
  const int k = bounded_compressions(int(Collective::kAllReduce), n);
  for (float e : {0x1p-7f, 0x1p-4f, 0.5f}) {
    const World w = run(n, bounded_cfg(t, e), x);
    for (const auto& s : w.stats) ASSERT_EQ(s.path, Path::kCompressed);
    expect_identical(w, "sum");
    double worst = 0;
    for (int64_t i = 0; i < numel; ++i) worst = std::max(worst, std::fabs(double(w.out[0][size_t(i)]) - ref[size_t(i)]));
    EXPECT_LE(worst, double(k) * e) << topology_name(t) << " n=" << n << " e=" << e;
    // and the codec did lose something (the test can fail): more than one e somewhere for e >= 2^-4
    if (e >= 0x1p-4f) {
      EXPECT_GT(worst, double(e)) << "errors of several compressions add up";
    }
    // it sent less than raw float32 (2 (n - 1) copies of the bucket over all ranks)
    int64_t sent = 0;
    for (const auto& s : w.stats) sent += s.bytes_sent;
    EXPECT_LT(sent, 2 * (n - 1) * numel * 4);
  }
}

// Decimal bounds on real-valued data: k x e plus the float32 rounding of the
// additions (what mode none has as well).
TEST_P(BoundedTopo, SumAndMeanWithinBoundOnRealData) {
  const auto [t, n] = GetParam();
  const int64_t numel = 20000;
  std::mt19937 g(uint32_t(11 * n + int(t)));
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> x(size_t(n), std::vector<float>(static_cast<size_t>(numel)));
  for (auto& v : x) {
    float walk = 0;
    for (auto& y : v) y = (walk += nd(g) * 0.05f) + nd(g) * 0.01f;
  }
  const auto ref = exact_sum(x);
  std::vector<double> mag(size_t(numel), 0.0);
  for (const auto& v : x)
    for (int64_t i = 0; i < numel; ++i) mag[size_t(i)] += std::fabs(double(v[size_t(i)]));
  const int k = bounded_compressions(int(Collective::kAllReduce), n);
  for (float e : {1e-3f, 0.03f}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      const World w = run(n, bounded_cfg(t, e), x, op);
      expect_identical(w, "real data");
      const double div = op == ReduceOp::kMean ? n : 1;
      for (int64_t i = 0; i < numel; ++i) {
        const double slack = double(n + 1) * 0x1p-24 * (mag[size_t(i)] + double(k) * e) / div;
        ASSERT_LE(std::fabs(double(w.out[0][size_t(i)]) - ref[size_t(i)] / div), double(k) * e / div + slack)
            << topology_name(t) << " n=" << n << " e=" << e << " i=" << i << (div > 1 ? " mean" : " sum");
      }
    }
  }
}

// A relative bound: e = r x mean of the ranks' ranges, the same on every rank.
TEST_P(BoundedTopo, RelativeBoundResolvesAlike) {
  const auto [t, n] = GetParam();
  const int64_t numel = 10000;
  const auto x = grid_data(n, numel, uint32_t(3 * n + int(t)));
  double range_sum = 0;
  for (const auto& v : x) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    range_sum += double(*hi) - double(*lo);
  }
  const double r = 1e-3;
  const double e = r * range_sum / n;
  const World w = run(n, bounded_cfg(t, 0.0, r), x);
  expect_identical(w, "relative");
  const auto ref = exact_sum(x);
  const int k = bounded_compressions(int(Collective::kAllReduce), n);
  for (int64_t i = 0; i < numel; ++i)
    ASSERT_LE(std::fabs(double(w.out[0][size_t(i)]) - ref[size_t(i)]), k * e * (1 + 1e-6) + 1e-5) << i;
}

INSTANTIATE_TEST_SUITE_P(All, BoundedTopo,
                         ::testing::Combine(::testing::ValuesIn(schedule_topologies()),
                                            ::testing::Values(2, 3, 4, 5, 8)));

// A bf16 bucket: values are read as float, partial sums stay float32 on the
// wire, and only the result is rounded to bf16 (at most 2^-8 of its size).
TEST(BoundedCollective, Bf16BucketWithinBoundPlusFinalRounding) {
  for (Topology t : schedule_topologies())
    for (int n : {2, 3, 4}) {
      const int64_t numel = 12000;
      const auto xf = grid_data(n, numel, uint32_t(40 + n));
      std::vector<std::vector<uint16_t>> x(size_t(n), std::vector<uint16_t>(static_cast<size_t>(numel)));
      std::vector<double> ref(static_cast<size_t>(numel), 0.0);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < numel; ++i) {
          x[size_t(r)][size_t(i)] = f32_to_bf16(xf[size_t(r)][size_t(i)]);
          ref[size_t(i)] += double(bf16_to_f32(x[size_t(r)][size_t(i)]));
        }
      const float e = 0x1p-6f;
      const CollectiveConfig cfg = bounded_cfg(t, e);
      InprocWorld world(n, std::chrono::seconds(120));
      world.run([&](int r, Transport& tr) {
        CallArgs a;
        a.data = x[size_t(r)].data();
        a.dtype = DType::kBF16;
        a.numel = numel;
        a.seq = 9;
        EXPECT_EQ(all_reduce(tr, cfg, a).path, Path::kCompressed);
      });
      for (int r = 1; r < n; ++r) ASSERT_EQ(x[size_t(r)], x[0]) << "rank " << r;
      for (int64_t i = 0; i < numel; ++i) {
        const double y = double(bf16_to_f32(x[0][size_t(i)]));
        ASSERT_LE(std::fabs(y - ref[size_t(i)]), n * double(e) + 0x1p-8 * (std::fabs(ref[size_t(i)]) + n * double(e)))
            << topology_name(t) << " n=" << n << " i=" << i;
      }
    }
}

TEST(BoundedCollective, NonFiniteInputTakesTheExactPath) {
  const int n = 3;
  auto x = grid_data(n, 10000, 99);
  x[1][77] = std::numeric_limits<float>::infinity();
  x[2][500] = std::nanf("");
  const World w = run(n, bounded_cfg(kTopologyRing, 0.01), x);
  for (const auto& s : w.stats) EXPECT_EQ(s.path, Path::kExactNonfinite);
  EXPECT_TRUE(std::isinf(w.out[0][77]));
  EXPECT_TRUE(std::isnan(w.out[0][500]));
  const auto ref = exact_sum(x);
  EXPECT_EQ(double(w.out[0][1]), ref[1]) << "the exact path sums exactly (grid data)";
}

// Reduce-scatter: rank c's shard is within bounded_compressions x e = (n - 1) e of the exact sum.
TEST(BoundedCollective, ReduceScatterWithinBound) {
  for (Topology t : schedule_topologies(Collective::kReduceScatter))
    for (int n : {2, 3, 4}) {
      const CollectiveConfig cfg = bounded_cfg(t, 0x1p-5);
      const int64_t shard = padded_shard(cfg, Collective::kReduceScatter, n, 8192);
      const auto x = grid_data(n, shard * n, uint32_t(n));
      const auto ref = exact_sum(x);
      std::vector<std::vector<float>> out(size_t(n), std::vector<float>(static_cast<size_t>(shard)));
      InprocWorld world(n, std::chrono::seconds(120));
      world.run([&](int r, Transport& tr) {
        CallArgs a;
        a.data = const_cast<float*>(x[size_t(r)].data());
        a.output = out[size_t(r)].data();
        a.dtype = DType::kF32;
        a.numel = shard * n;
        a.seq = 5;
        a.kind = Collective::kReduceScatter;
        collective(tr, cfg, a);
      });
      const int k = bounded_compressions(int(Collective::kReduceScatter), n);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < shard; ++i)
          ASSERT_LE(std::fabs(double(out[size_t(r)][size_t(i)]) - ref[size_t(r * shard + i)]), k * 0x1p-5)
              << topology_name(t) << " n=" << n << " rank " << r << " i=" << i;
    }
}

}  // namespace
}  // namespace dynamiq
