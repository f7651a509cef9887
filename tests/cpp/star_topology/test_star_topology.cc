// The test-only "star" topology (star_topology.cc), registered from this
// folder with one line, runs through the collective driver like a built-in
// schedule: all-reduce on 1 to 8 ranks, exact sums on every rank, the hub
// carrying every message; the collectives it does not run are refused on
// every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/topology.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace star_test {
namespace {

TEST(StarTopology, IsRegisteredForAllReduceOnly) {
  const Topology star = topology_id("star");
  EXPECT_EQ(star, Topology(200));
  EXPECT_STREQ(topology_name(star), "star");
  const auto has = [&](Collective k) {
    const auto v = schedule_topologies(k);
    return std::find(v.begin(), v.end(), star) != v.end();
  };
  EXPECT_TRUE(has(Collective::kAllReduce));
  EXPECT_FALSE(has(Collective::kReduceScatter));
  EXPECT_FALSE(has(Collective::kAllGather));
}

class StarAllReduce : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

// Integer-valued float32 inputs: every partial sum is exact, so every rank
// must hold exactly the elementwise sum. The hub (rank 0) receives every
// leaf's messages and sends each leaf its final bytes (a ring or two-step
// would spread the traffic over every rank).
TEST_P(StarAllReduce, SumsExactlyThroughTheHub) {
  const auto [mode, n] = GetParam();
  const int64_t numel = 10007;  // > min_compress_numel, a partial last unit
  std::mt19937 g(uint32_t(31 * n));
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(numel)));
  std::vector<float> ref(static_cast<size_t>(numel), 0.f);
  for (auto& v : x)
    for (int64_t i = 0; i < numel; ++i) ref[size_t(i)] += v[size_t(i)] = float(d(g));
  CollectiveConfig cfg;
  cfg.mode = mode_id(mode);
  cfg.topology = topology_id("star");
  cfg.block_bytes = 4096;  // several blocks
  std::vector<CallStats> st(static_cast<size_t>(n));
  InprocWorld world(n, std::chrono::seconds(60));
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = x[size_t(r)].data();
    a.numel = numel;
    a.seq = 3;
    st[size_t(r)] = all_reduce(t, cfg, a);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(x[size_t(r)], ref) << mode << " n=" << n << " rank " << r;
  if (n == 1) return;
  int64_t leaves_sent = 0;
  for (int r = 1; r < n; ++r) {
    leaves_sent += st[size_t(r)].bytes_sent;
    EXPECT_EQ(st[size_t(r)].bytes_received * (n - 1), st[0].bytes_sent) << "each leaf gets the hub's bytes once";
    EXPECT_EQ(st[size_t(r)].messages_sent, st[1].messages_sent);
  }
  EXPECT_EQ(st[0].bytes_received, leaves_sent) << "the hub receives every leaf's messages";
  EXPECT_EQ(st[0].messages_sent, int64_t(n - 1) * st[1].messages_sent) << "the hub answers every leaf";
}

INSTANTIATE_TEST_SUITE_P(OneToEightRanks, StarAllReduce,
                         ::testing::Combine(::testing::Values("none", "lossless"), ::testing::Range(1, 9)));

TEST(StarTopology, ReduceScatterIsRefusedOnEveryRank) {
  const int n = 3;
  std::vector<std::string> errs(static_cast<size_t>(n));
  InprocWorld world(n, std::chrono::seconds(30));
  world.run([&](int r, Transport& t) {
    std::vector<float> v(size_t(n) * 4096, 1.f), out(4096);
    CallArgs a;
    a.kind = Collective::kReduceScatter;
    a.data = v.data();
    a.output = out.data();
    a.numel = int64_t(v.size());
    CollectiveConfig cfg;
    cfg.topology = topology_id("star");
    try {
      collective(t, cfg, a);
    } catch (const Error& e) {
      errs[size_t(r)] = e.what();
    }
  });
  for (const std::string& e : errs) {
    EXPECT_NE(e.find("topology 'star' runs all-reduces only; use ring, butterfly, twostep"), std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace star_test
}  // namespace dynamiq
