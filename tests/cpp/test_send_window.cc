// The executor's send window under Gloo's send semantics (InprocWorld's
// rendezvous sends: a message moves only once both ends are posted, and a
// send reports completion only from wait()):
//  - the emulation itself behaves so;
//  - every mode, topology and world size 1-6 runs to the end with a window
//    far smaller than a chunk (the executor then waits on old sends all the
//    time: a deadlock would show as a timeout) and gives bit for bit what the
//    eager transport gives;
//  - what a collective keeps in its buffer pool is bounded by its finals and
//    the two windows, not by everything it sent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/executor.h"
#include "hook/transport/inproc_transport.h"

namespace dynamiq {
namespace {

TEST(RendezvousSends, MoveOnlyOnceBothEndsArePosted) {
  InprocWorld world(2, std::chrono::seconds(20));
  world.set_rendezvous_sends(true);
  std::vector<int> got(4, 0);
  world.run([&](int r, Transport& t) {
    std::vector<int> mine{10 * r + 1, 10 * r + 2, 10 * r + 3, 10 * r + 4};
    if (r == 0) {
      auto s = t.isend(mine.data(), 16, 1, 7);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_FALSE(s->test()) << "a send reports completion before wait()";
      // The receiver posts only after 300 ms: the bytes read are the buffer's at that time.
      mine[0] = 99;
      s->wait();
      EXPECT_TRUE(s->test());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      auto q = t.irecv(got.data(), 16, 0, 7);
      q->wait();
    }
  });
  EXPECT_EQ(got, (std::vector<int>{99, 2, 3, 4}));
}

TEST(RendezvousSends, WaitingOnASendNobodyReceivesTimesOut) {
  InprocWorld world(2, std::chrono::milliseconds(300));
  world.set_rendezvous_sends(true);
  EXPECT_THROW(world.run([&](int r, Transport& t) {
                 int x = r;
                 if (r == 0) t.isend(&x, sizeof(x), 1, 1)->wait();
               }),
               TransportError);
}

TEST(RendezvousSends, SizeMismatchIsAnError) {
  InprocWorld world(2, std::chrono::seconds(10));
  world.set_rendezvous_sends(true);
  EXPECT_THROW(world.run([&](int r, Transport& t) {
                 std::vector<uint8_t> b(64);
                 if (r == 0) t.isend(b.data(), 64, 1, 1)->wait();
                 else t.irecv(b.data(), 32, 0, 1)->wait();
               }),
               TransportError);
}

CollectiveConfig mode_cfg(Mode m, Topology topo) {
  CollectiveConfig c;
  c.mode = m;
  c.topology = topo;
  c.seed = 11;
  c.block_bytes = 2048;     // many blocks per chunk
  c.window_bytes = 4096;    // receive and send windows of about two blocks
  c.min_compress_numel = 0;
  return c;
}

// Runs one collective per rank; returns every rank's result and pool bytes.
struct Result {
  std::vector<std::vector<float>> out;
  std::vector<size_t> pool;
  std::vector<int64_t> sent, received;  // main all-reduce bytes per rank
};
Result run_once(int n, const CollectiveConfig& cfg, const std::vector<std::vector<float>>& in, bool rendezvous,
             ReduceOp op) {
  Result res;
  res.out = in;
  res.pool.assign(size_t(n), 0);
  res.sent.assign(size_t(n), 0);
  res.received.assign(size_t(n), 0);
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_rendezvous_sends(rendezvous);
  world.set_accepts_shorter_messages(true);  // as Gloo
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = res.out[size_t(r)].data();
    a.dtype = DType::kF32;
    a.numel = int64_t(in[size_t(r)].size());
    a.op = op;
    a.seq = 5;
    const CallStats cs = all_reduce(t, cfg, a);
    res.pool[size_t(r)] = executor_pool_bytes();
    res.sent[size_t(r)] = cs.bytes_sent;
    res.received[size_t(r)] = cs.bytes_received;
  });
  return res;
}

std::vector<std::vector<float>> gaussian(int n, int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<std::vector<float>> x(size_t(n), std::vector<float>(static_cast<size_t>(numel)));
  for (auto& v : x)
    for (auto& e : v) e = d(g);
  return x;
}

TEST(SendWindow, EveryScheduleRunsUnderRendezvousSendsAndGivesTheSameBits) {
  for (Mode m : {mode_id("none"), mode_id("dynamiq"), mode_id("lossless"), mode_id("bitsplit")})
    for (Topology topo : schedule_topologies())
      for (int n = 1; n <= 6; ++n)
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
          SCOPED_TRACE(std::string(mode_name(m)) + " " + topology_name(topo) + " n=" + std::to_string(n) +
                       (op == ReduceOp::kMean ? " mean" : " sum"));
          const auto in = gaussian(n, 40000 + 37 * n, 100 + uint32_t(n));
          const CollectiveConfig cfg = mode_cfg(m, topo);
          const Result eager = run_once(n, cfg, in, false, op);
          const Result rv = run_once(n, cfg, in, true, op);
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(0, std::memcmp(rv.out[size_t(r)].data(), eager.out[size_t(r)].data(),
                                     in[0].size() * sizeof(float)))
                << "rank " << r;
            ASSERT_EQ(0, std::memcmp(rv.out[size_t(r)].data(), rv.out[0].data(), in[0].size() * sizeof(float)))
                << "rank " << r << " differs from rank 0";
          }
        }
}

// Two ranks, ring, mean of a 16 MB float32 bucket in 256 KB blocks, 1 MB
// windows. A rank keeps its own chunk's final bytes for the all-gather (half
// the bucket's wire bytes; mode none keeps them in the bucket, divided in
// place: Codec::output_view) and may post a receive window ahead; its leaf
// messages (the other half) must not pile up. Measured: none 1.0 MB (9.4 MB
// when finals were a copy), lossless 10.2 MB (17.8 MB without the send
// window: every message it had sent, kept until the end), dynamiq 3.2 MB.
TEST(SendWindow, PoolHoldsFinalsAndWindowsNotEverythingSent) {
  const int64_t numel = 4 << 20;
  const size_t bucket = size_t(numel) * 4, window = 1 << 20, block = 256 << 10;
  const auto in = gaussian(2, numel, 3);
  for (Mode m : {mode_id("none"), mode_id("lossless"), mode_id("dynamiq")}) {
    CollectiveConfig cfg = mode_cfg(m, kTopologyRing);
    cfg.block_bytes = int64_t(block);
    cfg.window_bytes = int64_t(window);
    const ReduceOp op = ReduceOp::kMean;
    const Result rv = run_once(2, cfg, in, true, op);
    // finals: at most half the bucket (raw, or its worst-case coded size), plus
    // a receive window, a send window and a block of slack for each.
    const size_t finals = m == mode_id("none") ? 0 : m == mode_id("dynamiq") ? bucket / 2 / 4 : bucket / 2 + bucket / 64;
    for (int r = 0; r < 2; ++r)
      EXPECT_LE(rv.pool[size_t(r)], finals + 2 * window + 4 * block)
          << mode_name(m) << " rank " << r << ": pool " << rv.pool[size_t(r)];
  }
}

// Butterfly on a world that is not a power of two (n = 3, 6): the extra
// ranks p..n-1 send each chunk straight to its owner and get it back from it.
// No rank sums more than half the bucket in float (B/2 for a float32 bucket of
// B bytes); everything else it holds is wire bytes at <= 5 bits per
// coordinate (<= 5/32 of the float32 size), each kind less than one bucket's
// worth: the extra ranks' messages, its partners', its own pending and final
// bytes. So the pool stays under B/2 + 4 * 5/32 * B = 1.125 B. Measured (1 MB
// bucket, dynamiq, largest rank): 1.33 B (n=3) and 1.41 B (n=6) with the first
// fold (a partner took an extra rank's whole bucket into float), 0.76 B and
// 0.65 B now.
TEST(SendWindow, ButterflyWithExtraRanksSumsAtMostHalfTheBucketInFloat) {
  const int64_t numel = 1 << 18;
  const double B = double(numel) * 4;
  for (Mode m : {mode_id("dynamiq"), mode_id("bitsplit")})
    for (int n : {3, 6}) {
      CollectiveConfig cfg = mode_cfg(m, topology_id("butterfly"));
      cfg.block_bytes = 16384;
      cfg.window_bytes = 16 << 20;  // windows larger than the bucket: they bound nothing here
      const auto in = gaussian(n, numel, 7 + uint32_t(n));
      const Result rv = run_once(n, cfg, in, true, ReduceOp::kMean);
      for (int r = 0; r < n; ++r)
        EXPECT_LE(double(rv.pool[size_t(r)]), B / 2 + 4 * 5.0 / 32.0 * B)
            << mode_name(m) << " n=" << n << " rank " << r << ": pool " << rv.pool[size_t(r)];
    }
}

// The extra ranks' traffic is spread over the chunk owners. With W the wire
// bytes of one whole bucket (what an extra rank sends: each chunk once), a
// rank c < p receives its partners' halving messages (1 - 1/p) W, the extra
// ranks' share of its chunk (n - p) W / p and the doubling finals
// (1 - 1/p) W; an extra rank receives W. DynamiQ's message sizes follow from
// the plan alone, so these are exact up to rounding of chunk boundaries. The
// first fold had one partner receive an extra rank's whole bucket, W instead
// of W / p (n = 3: 2 W where this allows 1.5 W).
TEST(SendWindow, ButterflySpreadsTheExtraRanksTrafficOverTheOwners) {
  for (int n : {3, 5, 6, 7}) {
    CollectiveConfig cfg = mode_cfg(mode_id("dynamiq"), topology_id("butterfly"));
    cfg.block_bytes = 16384;
    const auto in = gaussian(n, 1 << 18, 20 + uint32_t(n));
    const Result rv = run_once(n, cfg, in, false, ReduceOp::kSum);
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const double W = double(rv.sent[size_t(p)]);
    for (int e = p; e < n; ++e) {
      EXPECT_NEAR(double(rv.sent[size_t(e)]), W, 0.001 * W) << "n=" << n << " extra rank " << e;
      EXPECT_NEAR(double(rv.received[size_t(e)]), W, 0.01 * W) << "n=" << n << " extra rank " << e;
    }
    const double owner = (2.0 * (1.0 - 1.0 / p) + double(n - p) / p) * W;
    for (int r = 0; r < p; ++r)
      EXPECT_LE(double(rv.received[size_t(r)]), 1.01 * owner)
          << "n=" << n << " rank " << r << " received " << rv.received[size_t(r)] << " of W=" << W;
  }
}

}  // namespace
}  // namespace dynamiq
