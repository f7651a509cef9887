// NCCL's point-to-point ordering rule (InprocWorld::nccl_order_violations):
// the checker itself on hand-made posting orders, the default posting of the
// ring (which follows it), and the executor's pairwise posting, which follows
// it everywhere (experiments/nccl_order_audit.cc audits every mode and topology).
#include <gtest/gtest.h>

#include <cstring>
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

// With the default posting (receives posted ahead, for Gloo) the ring with
// three or more ranks already follows the rule (each pair carries one
// direction only) for the fixed-size codecs, metadata all-reduce included.
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

// With a pairwise-ordered transport (as NCCL's will be) the executor posts
// receives in program order, a send with the receive that follows it from the
// same peer in one group when the peer does the same (an exchange), and the
// second parts of two-part messages (lossless) after the first: every pair
// then follows the rule in every mode, topology and world size 2-6, and the
// results and byte counts are exactly those of the default posting.
TEST(NcclOrder, PairwisePostingFollowsItEverywhereWithTheSameResults) {
  const int64_t numel = 256 * 64 + 11;
  for (Mode mode : {Mode::kNone, Mode::kDynamiq, Mode::kBitsplit, Mode::kLossless})
    for (Topology topo : {Topology::kRing, Topology::kButterfly, Topology::kTwoStep})
      for (int n : {2, 3, 4, 5, 6}) {
        SCOPED_TRACE(std::string(mode_name(mode)) + " " + topology_name(topo) + " n=" + std::to_string(n));
        CollectiveConfig cfg;
        cfg.mode = mode;
        cfg.topology = topo;
        cfg.bits = mode == Mode::kBitsplit ? 4.0 : 5.0;
        cfg.block_bytes = 4096;  // several blocks per chunk
        std::vector<std::vector<float>> out[2];
        std::vector<int64_t> sent[2];
        for (int pairwise = 0; pairwise < 2; ++pairwise) {
          auto& x = out[pairwise];
          x.resize(size_t(n));
          for (int r = 0; r < n; ++r) x[size_t(r)] = dqtest::gaussian(size_t(numel), uint64_t(r + 1));
          sent[pairwise].assign(size_t(n), 0);
          InprocWorld world(n, std::chrono::seconds(60));
          world.set_pairwise_ordered(pairwise == 1);
          world.run([&](int r, Transport& tr) {
            CallArgs a;
            a.data = x[size_t(r)].data();
            a.numel = numel;
            a.seq = 1;
            sent[pairwise][size_t(r)] = all_reduce(tr, cfg, a).bytes_sent;
          });
          if (pairwise) {
            const auto v = world.nccl_order_violations();
            EXPECT_TRUE(v.empty()) << v.size() << " pairs, first: " << v[0];
          }
        }
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(0, std::memcmp(out[0][size_t(r)].data(), out[1][size_t(r)].data(), size_t(numel) * 4))
              << "rank " << r;
        EXPECT_EQ(sent[0], sent[1]);
      }
}

}  // namespace
}  // namespace dynamiq
