// Latency of a collective in rounds (InprocWorld::nccl_stream_rounds: NCCL's
// one-stream model, where every operation costs one round once both its ends
// run it). A round is the fixed cost of a message (tens of microseconds on a
// real network, a kernel launch and an event wait on a GPU), paid whatever
// the bytes, so on small buckets and large worlds rounds, not bytes, set the
// time.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

int floor_log2(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

// Rounds of one all-reduce of `numel` floats with NCCL's posting, and the
// path it took on rank 0.
int64_t rounds_of(Mode mode, Topology topo, int n, int64_t numel, Path* path = nullptr) {
  CollectiveConfig cfg;
  cfg.mode = mode;
  cfg.topology = topo;
  std::vector<std::vector<float>> x(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) x[size_t(r)] = dqtest::gaussian(size_t(numel), uint64_t(r + 1));
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_posts_in_order(true);
  world.run([&](int r, Transport& tr) {
    CallArgs a;
    a.data = x[size_t(r)].data();
    a.numel = numel;
    a.seq = 1;
    const CallStats cs = all_reduce(tr, cfg, a);
    if (r == 0 && path) *path = cs.path;
  });
  return world.nccl_stream_rounds();
}

TEST(Rounds, TheModelCountsARingsStepsAndItsHeader) {
  // mode none: the header all-reduce, then a ring of 2(n-1) steps (one block
  // per chunk at this size)
  for (int n : {2, 3, 5, 8}) {
    const int64_t numel = 256 * 4 * n;
    EXPECT_EQ(rounds_of(mode_id("none"), kTopologyRing, n, numel), 1 + 2 * (n - 1)) << "n=" << n;
    // two-step: every peer's block in one group, then the finals in another
    EXPECT_EQ(rounds_of(mode_id("none"), topology_id("twostep"), n, numel), 1 + 2) << "n=" << n;
    // butterfly on a power of two: log2 n halving and log2 n doubling steps
    // (each step's chunks in one group)
    if ((n & (n - 1)) == 0) {
      EXPECT_EQ(rounds_of(mode_id("none"), topology_id("butterfly"), n, numel), 1 + 2 * floor_log2(n)) << "n=" << n;
    }
  }
}

// Lossless messages have two parts; on an ordered transport the second parts
// follow once the first parts told their sizes, as one more group per joined
// group: at most twice the rounds of mode none, however many chunks or peers
// a step has (it was one group per chunk and peer: 2(n-1) per phase on
// two-step).
TEST(Rounds, LosslessSecondPartsTakeOneMoreRoundPerGroup) {
  for (int n : {3, 4, 5, 8}) {
    const int64_t numel = 256 * 4 * n;
    for (Topology topo : {topology_id("twostep"), topology_id("butterfly")}) {
      const int64_t none = rounds_of(mode_id("none"), topo, n, numel);
      const int64_t lossless = rounds_of(mode_id("lossless"), topo, n, numel);
      ASSERT_GT(none, 0);
      ASSERT_GT(lossless, 0);
      EXPECT_LE(lossless - 1, 2 * (none - 1)) << topology_name(topo) << " n=" << n;
    }
    EXPECT_LE(rounds_of(mode_id("lossless"), topology_id("twostep"), n, numel), 1 + 4) << "n=" << n;
  }
}

// DynamiQ's statistics all-reduce (the paper's metadata exchange) is small:
// its rounds are its whole cost. From 4 ranks on it never goes around a ring
// (2(n-1) rounds): two-step (2 rounds) for ring and two-step buckets, a
// butterfly (about 2 log2 n) for butterfly buckets.
TEST(Rounds, StatisticsAllReduceTakesLogarithmicRounds) {
  std::printf("  n  topology   rounds: none  dynamiq  statistics (dynamiq - none)\n");
  for (Topology topo : schedule_topologies())
    for (int n : {2, 3, 4, 5, 6, 7, 8, 12, 16, 17}) {
      const int64_t numel = 4096 * n;  // compressed (>= min_compress_numel), one block per chunk
      Path path = Path::kExactMode;
      const int64_t none = rounds_of(mode_id("none"), topo, n, numel);
      const int64_t dq = rounds_of(mode_id("dynamiq"), topo, n, numel, &path);
      ASSERT_EQ(path, Path::kCompressed) << "n=" << n;
      ASSERT_GT(none, 0);
      ASSERT_GT(dq, 0);
      const int64_t stats = dq - none;
      std::printf("%3d  %-9s  %11lld  %7lld  %10lld\n", n, topology_name(topo), (long long)none,
                  (long long)dq, (long long)stats);
      // butterfly on p = 2^floor(log2 n) ranks: 2 log2 p steps; the n - p
      // extra ranks add their sends to the owners and the owners' sends back
      const int p = 1 << floor_log2(n);
      const int64_t bound = topo == topology_id("butterfly") ? 2 * floor_log2(n) + 2 * (n - p) + 2
                            : topo == kTopologyRing && n <= 3 ? 2 * (n - 1)
                                                                : 2;
      EXPECT_LE(stats, bound) << topology_name(topo) << " n=" << n;
    }
}

}  // namespace
}  // namespace dynamiq
