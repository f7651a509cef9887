// Buckets larger than CollectiveConfig::max_collective_bytes run as several
// whole collectives, one after the other: exact modes still give exact sums,
// slice 0 is the very collective its elements would have had as a bucket of
// their own (same seq; the keys of unsplit buckets are slice 0's), later
// slices draw other randomness, the budget holds, every rank agrees, the
// working memory follows the slice and not the bucket, and a rank with bad
// input still makes every rank raise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/executor.h"
#include "hook/transport/inproc_transport.h"

namespace dynamiq {
namespace {

using Data = std::vector<std::vector<float>>;

CollectiveConfig cfg_for(Mode m, Topology t, int64_t max_bytes) {
  CollectiveConfig c;
  c.mode = m;
  c.topology = t;
  c.seed = 3;
  c.block_bytes = 8192;
  c.max_collective_bytes = max_bytes;
  return c;
}

std::vector<CallStats> run(int n, const CollectiveConfig& cfg, Data& x, ReduceOp op, uint64_t seq = 9,
                           bool rendezvous = false, std::vector<size_t>* pool = nullptr) {
  std::vector<CallStats> st(static_cast<size_t>(n));
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_rendezvous_sends(rendezvous);
  world.set_accepts_shorter_messages(true);
  if (pool) pool->assign(size_t(n), 0);
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = x[size_t(r)].data();
    a.dtype = DType::kF32;
    a.numel = int64_t(x[size_t(r)].size());
    a.op = op;
    a.seq = seq;
    st[size_t(r)] = all_reduce(t, cfg, a);
    if (pool) (*pool)[size_t(r)] = executor_pool_bytes();
  });
  return st;
}

Data integers(int n, int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-1000, 1000);
  Data x(size_t(n), std::vector<float>(static_cast<size_t>(numel)));
  for (auto& v : x)
    for (auto& e : v) e = float(d(g));
  return x;
}

TEST(Slices, ExactModesStayExact) {
  const int64_t numel = 100003;  // 64 KB slices = 16384 floats: 7 slices, the last one short
  for (Mode m : {mode_id("none"), mode_id("lossless")})
    for (Topology t : schedule_topologies())
      for (int n : {2, 3}) {
        SCOPED_TRACE(std::string(mode_name(m)) + " " + topology_name(t) + " n=" + std::to_string(n));
        Data x = integers(n, numel, 7);
        std::vector<float> sum(static_cast<size_t>(numel), 0.f);
        for (const auto& v : x)
          for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
        const auto st = run(n, cfg_for(m, t, 64 << 10), x, ReduceOp::kSum);
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(st[size_t(r)].slices, 7);
          EXPECT_EQ(st[size_t(r)].numel, numel);
          ASSERT_EQ(x[size_t(r)], sum) << "rank " << r;
        }
      }
}

TEST(Slices, FirstSliceIsItsOwnCollectiveAndLaterSlicesDrawOtherRandomness) {
  // Every rank's bucket is [v, v]: two identical halves, one slice each.
  const int n = 3;
  const int64_t half = 64 * 1024;
  for (Mode m : {mode_id("dynamiq"), mode_id("bitsplit")}) {
    SCOPED_TRACE(mode_name(m));
    std::mt19937 g(5);
    std::normal_distribution<float> d(0.f, 1.f);
    Data halves(n, std::vector<float>(static_cast<size_t>(half))), both(n);
    for (int r = 0; r < n; ++r) {
      for (auto& e : halves[size_t(r)]) e = d(g);
      both[size_t(r)] = halves[size_t(r)];
      both[size_t(r)].insert(both[size_t(r)].end(), halves[size_t(r)].begin(), halves[size_t(r)].end());
    }
    std::vector<double> exact(static_cast<size_t>(half), 0.0);
    for (const auto& v : halves)
      for (size_t i = 0; i < v.size(); ++i) exact[i] += v[i];
    const auto st_split = run(n, cfg_for(m, kTopologyRing, half * 4), both, ReduceOp::kSum);
    const auto st_alone = run(n, cfg_for(m, kTopologyRing, half * 4), halves, ReduceOp::kSum);
    EXPECT_EQ(st_split[0].slices, 2);
    EXPECT_EQ(st_alone[0].slices, 1);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(both[size_t(r)], both[0]) << "rank " << r << " differs";
      // slice 0 == the first half all-reduced on its own (same seq): bit for bit
      ASSERT_EQ(0, std::memcmp(both[size_t(r)].data(), halves[size_t(r)].data(), size_t(half) * 4));
    }
    // slice 1 saw the same values with another key: its errors are not slice 0's
    double e0e1 = 0, e0e0 = 0, e1e1 = 0;
    for (int64_t i = 0; i < half; ++i) {
      const double a = both[0][size_t(i)] - exact[size_t(i)], b = both[0][size_t(half + i)] - exact[size_t(i)];
      e0e1 += a * b;
      e0e0 += a * a;
      e1e1 += b * b;
    }
    const double corr = e0e1 / std::sqrt(e0e0 * e1e1);
    EXPECT_LT(std::fabs(corr), 0.05) << "errors of the two slices correlate: " << corr;
    EXPECT_GT(e0e0, 0.0);
    if (m == mode_id("dynamiq")) {
      EXPECT_LE(st_split[0].bits_per_coord, 5.0 + 1e-9);
    }
  }
}

// Lossless on 2 ranks keeps its own chunk's final bytes (half the collective)
// for the all-gather: with slices, half a slice. Rendezvous (Gloo-like) sends.
// A sliced bucket reports one path: the slices' common one, "mixed" when they
// differ (here the last slice, of one element, is below min_compress_numel),
// and exact-nonfinite when any slice had an inf or NaN; the allocator state is
// the one the compressed slices left, also when the last slice is exact.
TEST(Slices, ReportedPathIsMixedWhenSlicesDiffer) {
  const CollectiveConfig cfg = cfg_for(mode_id("dynamiq"), kTopologyRing, 4096 * 4);
  Data even = integers(2, 8192, 5);
  const std::vector<CallStats> se = run(2, cfg, even, ReduceOp::kSum);
  for (const CallStats& s : se) {
    EXPECT_EQ(s.slices, 2);
    EXPECT_EQ(s.path, Path::kCompressed);
    EXPECT_TRUE(s.has_u);
  }
  Data odd = integers(2, 8193, 6);
  for (const CallStats& s : run(2, cfg, odd, ReduceOp::kSum)) {
    EXPECT_EQ(s.slices, 3);
    EXPECT_EQ(s.path, Path::kMixed);
    // the allocator state the compressed slices left is reported, though the
    // last slice took an exact path (the hook carries it to the next step)
    EXPECT_TRUE(s.has_u);
    EXPECT_EQ(s.u_step, se[0].u_step);
  }
  Data inf = integers(2, 8193, 7);
  inf[1][10] = INFINITY;
  for (const CallStats& s : run(2, cfg, inf, ReduceOp::kSum)) EXPECT_EQ(s.path, Path::kExactNonfinite);
}

TEST(Slices, WorkingMemoryFollowsTheSliceNotTheBucket) {
  const int64_t numel = 4 << 20;  // 16 MB
  const int64_t slice = 2 << 20;  // 2 MB
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.f, 1.f);
  Data x(2, std::vector<float>(static_cast<size_t>(numel)));
  for (auto& v : x)
    for (auto& e : v) e = d(g);
  CollectiveConfig cfg = cfg_for(mode_id("lossless"), kTopologyRing, slice);
  cfg.block_bytes = 64 << 10;
  cfg.window_bytes = 256 << 10;
  std::vector<size_t> pool;
  Data y = x;
  const auto st = run(2, cfg, y, ReduceOp::kMean, 9, true, &pool);
  EXPECT_EQ(st[0].slices, 8);
  // half a slice of worst-case-sized finals, two windows, slack of a few blocks
  const size_t bound = size_t(slice) / 2 + size_t(slice) / 64 + 2 * (256 << 10) + 4 * (64 << 10);
  for (int r = 0; r < 2; ++r) EXPECT_LE(pool[size_t(r)], bound) << "rank " << r;
  // unsplit, the same call holds half the bucket
  cfg.max_collective_bytes = 0;
  Data z = x;
  const auto st1 = run(2, cfg, z, ReduceOp::kMean, 9, true, &pool);
  EXPECT_EQ(st1[0].slices, 1);
  EXPECT_GT(pool[0], size_t(numel) * 4 / 2);
  EXPECT_EQ(y, z);  // lossless: the same exact mean either way
}

TEST(Slices, BadInputOnOneRankRaisesOnEveryRank) {
  const int n = 3;
  InprocWorld world(n, std::chrono::seconds(20));
  std::vector<int> raised(n, 0);
  std::vector<float> x0(200000, 1.f), x1(200000, 1.f), x2(200000, 1.f);
  std::vector<float>* xs[] = {&x0, &x1, &x2};
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = xs[r]->data();
    a.numel = int64_t(xs[r]->size());
    a.local_error = r == 1 ? InputError::kDType : InputError::kNone;
    try {
      all_reduce(t, cfg_for(mode_id("dynamiq"), kTopologyRing, 64 << 10), a);
    } catch (const Error&) {
      raised[size_t(r)] = 1;
    }
  });
  EXPECT_EQ(raised, (std::vector<int>{1, 1, 1}));
}

// A rank whose Config splits differently (here: never) would run other
// collectives than its peers. The first one's header already differs (numel,
// config fingerprint), so every rank raises instead of waiting for peers that
// never come.
TEST(Slices, RanksDisagreeingOnMaxCollectiveBytesRaiseOnEveryRank) {
  const int n = 3;
  InprocWorld world(n, std::chrono::seconds(20));
  std::vector<int> raised(n, 0);
  std::vector<std::string> what(n);
  Data x = integers(n, 200000, 5);
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = x[size_t(r)].data();
    a.numel = int64_t(x[size_t(r)].size());
    try {
      all_reduce(t, cfg_for(mode_id("dynamiq"), kTopologyRing, r == 1 ? 0 : 64 << 10), a);
    } catch (const Error& e) {
      raised[size_t(r)] = 1;
      what[size_t(r)] = e.what();
    }
  });
  EXPECT_EQ(raised, (std::vector<int>{1, 1, 1}));
  for (const auto& w : what) {
    EXPECT_NE(w.find("ranks disagree on"), std::string::npos) << w;
    EXPECT_NE(w.find("numel"), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace dynamiq
