// NCCL's point-to-point ordering rule (InprocWorld::nccl_order_violations):
// the checker itself on hand-made posting orders, and the ring, which follows
// it today (experiments/nccl_order_audit.cc audits every mode and topology).
#include <gtest/gtest.h>

#include <vector>

#include "hook/collective.h"
#include "hook/inproc_transport.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

// Two ranks exchange one 8-byte message each way, each posting in `order`
// ("sr": send first, "rs": receive first), optionally inside one group.
std::vector<std::string> exchange(const char* order0, const char* order1, bool grouped) {
  InprocWorld world(2, std::chrono::seconds(10));
  world.run([&](int r, Transport& tr) {
    const char* order = r == 0 ? order0 : order1;
    uint64_t out = 1, in = 0;
    std::unique_ptr<Request> rq, sq;
    if (grouped) tr.group_start();
    for (const char* c = order; *c; ++c) {
      if (*c == 's') sq = tr.isend(&out, 8, 1 - r, 0);
      else rq = tr.irecv(&in, 8, 1 - r, 0);
    }
    if (grouped) tr.group_end();
    sq->wait();
    rq->wait();
  });
  return world.nccl_order_violations();
}

TEST(NcclOrder, TheCheckerFindsFacingSendsAndReceives) {
  EXPECT_TRUE(exchange("sr", "rs", false).empty()) << "send facing receive, then the reverse";
  const auto both_recv_first = exchange("rs", "rs", false);
  ASSERT_EQ(both_recv_first.size(), 1u);
  EXPECT_NE(both_recv_first[0].find("rank 0 posts receive of 8 bytes, rank 1 posts receive of 8 bytes"),
            std::string::npos)
      << both_recv_first[0];
  EXPECT_EQ(exchange("sr", "sr", false).size(), 1u) << "two sends facing each other";
  EXPECT_TRUE(exchange("rs", "rs", true).empty()) << "inside a group the order does not matter";
  EXPECT_TRUE(exchange("sr", "rs", true).empty());
}

// The ring with three or more ranks already follows the rule (each pair
// carries one direction only) for the fixed-size codecs, metadata all-reduce
// included; the NCCL binding can build on that. (The other topologies, two
// ranks and lossless's two-part messages do not yet:
// experiments/results/nccl_order.md.)
TEST(NcclOrder, RingWithThreeOrMoreRanksFollowsIt) {
  const int64_t numel = 256 * 64 + 11;
  for (Mode mode : {Mode::kNone, Mode::kDynamiq, Mode::kBitsplit})
    for (int n : {3, 4, 5, 8}) {
      CollectiveConfig cfg;
      cfg.mode = mode;
      cfg.topology = Topology::kRing;
      cfg.bits = mode == Mode::kBitsplit ? 4.0 : 5.0;
      cfg.block_bytes = 4096;  // several blocks per chunk, receives posted ahead
      std::vector<std::vector<float>> x(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) x[size_t(r)] = dqtest::gaussian(size_t(numel), uint64_t(r + 1));
      InprocWorld world(n, std::chrono::seconds(60));
      world.run([&](int r, Transport& tr) {
        CallArgs a;
        a.data = x[size_t(r)].data();
        a.numel = numel;
        a.seq = 1;
        all_reduce(tr, cfg, a);
      });
      const auto v = world.nccl_order_violations();
      EXPECT_TRUE(v.empty()) << mode_name(mode) << " n=" << n << ": " << v[0];
    }
}

}  // namespace
}  // namespace dynamiq
