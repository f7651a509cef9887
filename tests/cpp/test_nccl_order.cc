// NCCL's two ways of ordering point-to-point operations, checked on what the
// ranks posted: one stream per pair of ranks (InprocWorld::nccl_order_violations)
// and one stream per rank (nccl_stream_deadlock). The checkers on hand-made
// posting orders, the default posting of the ring (which follows the first),
// and the executor's posting for ordered transports, which runs under both
// everywhere (experiments/nccl_order_audit.cc audits every mode and topology).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
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

// Three ranks in a ring, each sending 64 bytes to the next and receiving from
// the previous, posted as `units` (each string one unit, in posting order:
// 's' send, 'r' receive; a unit of two is one group).
std::string ring3(std::vector<const char*> units, size_t recv_bytes = 64) {
  InprocWorld world(3, std::chrono::seconds(10));
  world.run([&](int r, Transport& tr) {
    std::vector<uint8_t> out(64, 1), in(recv_bytes);
    std::vector<std::unique_ptr<Request>> reqs;
    for (const char* u : units) {
      if (u[1]) tr.group_start();
      for (const char* c = u; *c; ++c) {
        if (*c == 's') reqs.push_back(tr.isend(out.data(), out.size(), (r + 1) % 3, 0));
        else reqs.push_back(tr.irecv(in.data(), in.size(), (r + 2) % 3, 0));
      }
      if (u[1]) tr.group_end();
    }
    if (recv_bytes == 64)
      for (auto& q : reqs) q->wait();
  });
  return world.nccl_stream_deadlock();
}

// NCCL matches by posting order, not by tag: two messages of one size from
// rank 0 to rank 1, received in the other order, would swap their bytes
// there (tags keep them apart in-process and on Gloo).
TEST(NcclOrder, TheStreamCheckerFindsMessagesMeetingTheWrongReceive) {
  for (bool swapped : {false, true}) {
    InprocWorld w(2, std::chrono::seconds(10));
    w.run([&](int r, Transport& tr) {
      uint64_t out[2] = {1, 2}, in[2] = {0, 0};
      std::vector<std::unique_ptr<Request>> q;
      tr.group_start();
      for (uint32_t k = 0; k < 2; ++k) {
        const uint32_t tag = swapped ? 1 - k : k;
        if (r == 0) q.push_back(tr.isend(&out[k], 8, 1, k));
        else q.push_back(tr.irecv(&in[tag], 8, 0, tag));
      }
      tr.group_end();
      for (auto& x : q) x->wait();
    });
    const std::string d = w.nccl_stream_deadlock();
    if (!swapped) EXPECT_EQ(d, "");
    else EXPECT_NE(d.find("send 0 from rank 0 to rank 1 has tag 0, the receive it meets in posting order tag 1"),
                   std::string::npos) << d;
  }
}

TEST(NcclOrder, TheStreamCheckerFindsCyclesAndSizeMismatches) {
  // every rank starts its stream with a send whose receiver is busy sending
  const std::string d = ring3({"s", "r"});
  EXPECT_NE(d.find("deadlock: rank 0 at unit 0 [send to 1 (64 bytes)]"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 2 at unit 0 [send to 0 (64 bytes)]"), std::string::npos) << d;
  EXPECT_EQ(ring3({"sr"}), "") << "send and receive in one group";
  EXPECT_EQ(ring3({"rs"}), "");
  // a receive first on every rank: the same cycle the other way round
  EXPECT_NE(ring3({"r", "s"}).find("deadlock"), std::string::npos);
  EXPECT_NE(ring3({"sr"}, 32).find("has 64 bytes, the receive 32"), std::string::npos);
  // one pair, one way each: send-then-receive facing receive-then-send runs
  // on one stream per rank too; two sends facing each other do not
  InprocWorld w(2, std::chrono::seconds(10));
  w.run([&](int r, Transport& tr) {
    uint64_t out = 1, in = 0;
    std::unique_ptr<Request> a, b;
    if (r == 0) {
      a = tr.isend(&out, 8, 1, 0);
      b = tr.irecv(&in, 8, 1, 0);
    } else {
      b = tr.irecv(&in, 8, 0, 0);
      a = tr.isend(&out, 8, 0, 0);
    }
    b->wait();
  });
  EXPECT_EQ(w.nccl_stream_deadlock(), "");
}

// With the default posting (receives posted ahead, for Gloo) the ring with
// three or more ranks already follows the rule (each pair carries one
// direction only) for the fixed-size codecs; DynamiQ's metadata all-reduce
// too on 3 ranks, where it goes around the ring (from 4 ranks it is
// two-step, whose pairs carry both directions: that needs the ordered posting
// of the next test).
TEST(NcclOrder, RingWithThreeOrMoreRanksFollowsIt) {
  const int64_t numel = 256 * 64 + 11;
  for (Mode mode : {mode_id("none"), mode_id("dynamiq"), mode_id("bitsplit")})
    for (int n : {3, 4, 5, 8}) {
      if (mode == mode_id("dynamiq") && n > 3) continue;
      CollectiveConfig cfg;
      cfg.mode = mode;
      cfg.topology = kTopologyRing;
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

// With a transport that matches in posting order (NCCL) the executor posts
// receives in program order and each step's send and receive in one group (the
// second parts of two-part messages, lossless, in a second group once the
// first told their sizes): every rank's posting then runs under both of
// NCCL's models in every mode, topology and world size 2-6, and the results
// and byte counts are exactly those of the default posting.
TEST(NcclOrder, OrderedPostingRunsUnderBothModelsWithTheSameResults) {
  const int64_t numel = 256 * 64 + 11;
  for (Mode mode : {mode_id("none"), mode_id("dynamiq"), mode_id("bitsplit"), mode_id("lossless")})
    for (Topology topo : schedule_topologies())
      for (int n : {2, 3, 4, 5, 6}) {
        SCOPED_TRACE(std::string(mode_name(mode)) + " " + topology_name(topo) + " n=" + std::to_string(n));
        CollectiveConfig cfg;
        cfg.mode = mode;
        cfg.topology = topo;
        cfg.block_bytes = 4096;  // several blocks per chunk
        std::vector<std::vector<float>> out[2];
        std::vector<int64_t> sent[2];
        for (int ordered = 0; ordered < 2; ++ordered) {
          auto& x = out[ordered];
          x.resize(size_t(n));
          for (int r = 0; r < n; ++r) x[size_t(r)] = dqtest::gaussian(size_t(numel), uint64_t(r + 1));
          sent[ordered].assign(size_t(n), 0);
          InprocWorld world(n, std::chrono::seconds(60));
          world.set_posts_in_order(ordered == 1);
          world.run([&](int r, Transport& tr) {
            CallArgs a;
            a.data = x[size_t(r)].data();
            a.numel = numel;
            a.seq = 1;
            sent[ordered][size_t(r)] = all_reduce(tr, cfg, a).bytes_sent;
          });
          if (ordered) {
            const auto v = world.nccl_order_violations();
            EXPECT_TRUE(v.empty()) << v.size() << " pairs, first: " << v[0];
            EXPECT_EQ(world.nccl_stream_deadlock(), "");
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
