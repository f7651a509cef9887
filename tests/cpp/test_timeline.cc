// The per-operation timeline (CallArgs::timeline, timeline.h) over the whole
// driver and the in-process transport, every mode and topology, Gloo-like
// (rendezvous sends, one-part messages) and NCCL-like (ordered) posting:
//  - well formed: post <= start <= end for every event, a receive's `need`
//    after its post; the data sends' count and bytes are the executor's
//    messages_sent and bytes_sent, the metadata sends' bytes meta_bytes_sent,
//    the data kernels' durations add up to t_kernel; every receive has its
//    send on the peer (same tag, slice and part) and ends after that send
//    was posted (one clock for every rank);
//  - free of effects: the results and every rank's byte counts are
//    bit-identical with the timeline on and off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/executor.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/registry.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

using namespace dqtest;

struct Case {
  const char* mode;
  Topology topo;
  int n;
  bool ordered;
};

struct Outcome {
  std::vector<std::vector<float>> out;
  std::vector<CallStats> stats;
  std::vector<Timeline> tl;
};

Outcome run(const Case& c, bool timeline, int64_t numel, int64_t max_collective_bytes = 0) {
  CollectiveConfig cfg;
  cfg.mode = mode_id(c.mode);
  cfg.topology = c.topo;
  cfg.block_bytes = 4096;  // several pipelined blocks per chunk
  if (max_collective_bytes > 0) cfg.max_collective_bytes = max_collective_bytes;
  Outcome r;
  r.out.resize(size_t(c.n));
  r.stats.resize(size_t(c.n));
  r.tl.resize(size_t(c.n));
  for (int k = 0; k < c.n; ++k) {
    r.out[size_t(k)] = gaussian(size_t(numel), 500 + uint64_t(k));
    // repeated values: lossless has something to code
    for (int64_t i = 0; i < numel; i += 3) r.out[size_t(k)][size_t(i)] = 0.25f;
  }
  InprocWorld world(c.n, std::chrono::seconds(60));
  world.set_rendezvous_sends(!c.ordered);
  world.set_posts_in_order(c.ordered);
  world.set_accepts_shorter_messages(!c.ordered);
  world.run([&](int k, Transport& tr) {
    CallArgs a;
    a.data = r.out[size_t(k)].data();
    a.numel = numel;
    a.seq = 11;
    a.timeline = timeline ? &r.tl[size_t(k)] : nullptr;
    r.stats[size_t(k)] = all_reduce(tr, cfg, a);
  });
  return r;
}

std::string name(const Case& c) {
  return std::string(c.mode) + " " + topology_name(c.topo) + " n=" + std::to_string(c.n) +
         (c.ordered ? " ordered" : " gloo-like");
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* mode : {"none", "dynamiq", "lossless", "bitsplit"})
    for (Topology t : schedule_topologies())
      for (int n : {2, 3, 4})
        for (bool ordered : {false, true}) v.push_back({mode, t, n, ordered});
  return v;
}

void check_well_formed(const Case& c, const Outcome& r, const std::string& where) {
  using K = TimelineEvent::Kind;
  // (sender, receiver, tag, slice, part) -> the send's post time
  std::map<std::tuple<int, int, uint32_t, int32_t, std::string>, double> sends;
  for (int k = 0; k < c.n; ++k)
    for (const TimelineEvent& e : r.tl[size_t(k)].events)
      if (e.kind == K::kSend) sends[{k, e.peer, e.tag, e.slice, e.part}] = e.t_post;
  for (int k = 0; k < c.n; ++k) {
    const Timeline& tl = r.tl[size_t(k)];
    const CallStats& st = r.stats[size_t(k)];
    const std::string at = where + " rank " + std::to_string(k);
    EXPECT_EQ(tl.rank, k) << at;
    EXPECT_EQ(tl.world, c.n) << at;
    int64_t data_msgs = 0, data_bytes = 0, meta_bytes = 0;
    double kernel = 0.0;
    std::map<std::string, int> phases;
    for (const TimelineEvent& e : tl.events) {
      ASSERT_GT(e.t_post, 0.0) << at << " " << e.name;
      ASSERT_LE(e.t_post, e.t_start) << at << " " << e.name;
      ASSERT_LE(e.t_start, e.t_end) << at << " " << e.name;
      const std::string part = e.part;
      switch (e.kind) {
        case K::kPhase: phases[e.name] += 1; break;
        case K::kKernel:
          ASSERT_GE(e.block, 0) << at;
          ASSERT_GE(e.op, 0) << at;
          if (part == "data") kernel += e.t_end - e.t_start;
          break;
        case K::kSend:
          ASSERT_GE(e.peer, 0) << at;
          if (part == "data") {
            data_bytes += e.bytes;
            if (!(e.tag & kDynamicTagBit)) data_msgs += 1;  // a second part is not a message of its own
          } else {
            ASSERT_EQ(part, "meta") << at;
            meta_bytes += e.bytes;
          }
          break;
        case K::kRecv: {
          ASSERT_GE(e.t_need, e.t_post) << at << " receive never waited for";
          const auto s = sends.find({e.peer, k, e.tag, e.slice, part});
          ASSERT_NE(s, sends.end()) << at << " a receive without its send: peer " << e.peer << " tag " << e.tag;
          // in-process: one steady clock for every rank
          EXPECT_LE(s->second, e.t_end) << at << " a message that arrived before it was sent";
          break;
        }
      }
    }
    EXPECT_EQ(data_msgs, st.messages_sent) << at;
    EXPECT_EQ(data_bytes, st.bytes_sent) << at;
    EXPECT_EQ(meta_bytes, st.meta_bytes_sent) << at;
    EXPECT_NEAR(kernel, st.t_kernel, 1e-9 + 1e-9 * st.t_kernel) << at;
    EXPECT_EQ(phases["local"], int(st.slices)) << at;
    EXPECT_EQ(phases["header"], int(st.slices)) << at;
    if (st.path == Path::kCompressed) {
      EXPECT_EQ(phases["meta"], int(st.slices)) << at;
      EXPECT_EQ(phases["plan"], int(st.slices)) << at;
      EXPECT_EQ(phases["execute"], int(st.slices)) << at;
    } else {
      EXPECT_EQ(phases["exact"], int(st.slices)) << at;
    }
  }
}

TEST(Timeline, WellFormedEveryModeTopologyAndPosting) {
  for (const Case& c : cases()) {
    const Outcome r = run(c, true, 256 * 120 + 13);
    check_well_formed(c, r, name(c));
    // a send and a receive per message at least (the exact paths and mode none too)
    for (int k = 0; k < c.n; ++k) EXPECT_GT(r.stats[size_t(k)].messages_sent, 0) << name(c);
  }
}

TEST(Timeline, SlicesAreNumberedAndWellFormed) {
  const Case c{"dynamiq", kTopologyRing, 3, false};
  const Outcome r = run(c, true, 3 * 8192, 8192 * 4);  // 3 slices
  ASSERT_EQ(r.stats[0].slices, 3);
  check_well_formed(c, r, "sliced");
  std::map<int32_t, int> per_slice;
  for (const TimelineEvent& e : r.tl[0].events)
    if (e.kind == TimelineEvent::Kind::kPhase && std::string(e.name) == "execute") per_slice[e.slice] += 1;
  EXPECT_EQ(per_slice, (std::map<int32_t, int>{{0, 1}, {1, 1}, {2, 1}}));
}

TEST(Timeline, ResultsAndBytesBitIdenticalWithTheTimelineOnAndOff) {
  for (const Case& c : cases()) {
    const Outcome off = run(c, false, 256 * 120 + 13);
    const Outcome on = run(c, true, 256 * 120 + 13);
    for (int k = 0; k < c.n; ++k) {
      ASSERT_EQ(std::memcmp(off.out[size_t(k)].data(), on.out[size_t(k)].data(), off.out[size_t(k)].size() * 4), 0)
          << name(c) << " rank " << k;
      EXPECT_EQ(off.stats[size_t(k)].bytes_sent, on.stats[size_t(k)].bytes_sent) << name(c);
      EXPECT_EQ(off.stats[size_t(k)].bytes_received, on.stats[size_t(k)].bytes_received) << name(c);
      EXPECT_EQ(off.stats[size_t(k)].meta_bytes_sent, on.stats[size_t(k)].meta_bytes_sent) << name(c);
      EXPECT_TRUE(off.tl[size_t(k)].events.empty());
    }
  }
}

// Sends posted ahead (ExecArgs::send_ahead, here through $DYNAMIQ_SEND_AHEAD
// as the driver reads it): off, the default and far ahead give bit-identical
// results and the same byte counts on every rank, for every mode, topology
// and posting (ordered transports never post ahead).
TEST(SendAhead, ResultsAndBytesBitIdenticalOffDefaultAndFarAhead) {
  const char* before = std::getenv("DYNAMIQ_SEND_AHEAD");
  const std::string saved = before ? before : "";
  for (const Case& c : cases()) {
    std::vector<Outcome> runs;
    for (const char* v : {"0", "2", "64"}) {
      setenv("DYNAMIQ_SEND_AHEAD", v, 1);
      runs.push_back(run(c, false, 256 * 160 + 13));
    }
    for (size_t v = 1; v < runs.size(); ++v)
      for (int k = 0; k < c.n; ++k) {
        ASSERT_EQ(std::memcmp(runs[0].out[size_t(k)].data(), runs[v].out[size_t(k)].data(),
                              runs[0].out[size_t(k)].size() * 4), 0)
            << name(c) << " rank " << k << " variant " << v;
        EXPECT_EQ(runs[0].stats[size_t(k)].bytes_sent, runs[v].stats[size_t(k)].bytes_sent) << name(c);
        EXPECT_EQ(runs[0].stats[size_t(k)].messages_sent, runs[v].stats[size_t(k)].messages_sent) << name(c);
        EXPECT_EQ(runs[0].stats[size_t(k)].bytes_received, runs[v].stats[size_t(k)].bytes_received) << name(c);
      }
  }
  if (before) setenv("DYNAMIQ_SEND_AHEAD", saved.c_str(), 1); else unsetenv("DYNAMIQ_SEND_AHEAD");
}

// What send_ahead changes, seen in the timeline: with it, some send of a
// later op is posted before the executor waits for an earlier receive (the
// next block's leaf goes out while this block's message is awaited); without
// it, never. Ordered transports never post ahead.
TEST(SendAhead, TheTimelineShowsSendsPostedBeforeEarlierReceives) {
  const char* before = std::getenv("DYNAMIQ_SEND_AHEAD");
  const std::string saved = before ? before : "";
  auto ahead_posts = [](const Outcome& r, int n) {
    int count = 0;
    for (int k = 0; k < n; ++k) {
      const auto& ev = r.tl[size_t(k)].events;
      for (const TimelineEvent& s : ev) {
        if (s.kind != TimelineEvent::Kind::kSend || std::string(s.part) != "data") continue;
        for (const TimelineEvent& q : ev)
          if (q.kind == TimelineEvent::Kind::kRecv && std::string(q.part) == "data" && q.op < s.op &&
              s.t_post < q.t_need) {
            ++count;
            break;
          }
      }
    }
    return count;
  };
  for (Topology t : {kTopologyRing, topology_id("butterfly")})
    for (bool ordered : {false, true}) {
      const Case c{"dynamiq", t, 2, ordered};
      setenv("DYNAMIQ_SEND_AHEAD", "0", 1);
      EXPECT_EQ(ahead_posts(run(c, true, 256 * 400 + 13), c.n), 0) << name(c);
      setenv("DYNAMIQ_SEND_AHEAD", "2", 1);
      const int with = ahead_posts(run(c, true, 256 * 400 + 13), c.n);
      std::printf("%s: %d sends posted ahead\n", name(c).c_str(), with);
      if (ordered)
        EXPECT_EQ(with, 0) << name(c);
      else
        EXPECT_GT(with, 0) << name(c);
    }
  // the default posts ahead
  unsetenv("DYNAMIQ_SEND_AHEAD");
  const Case c{"dynamiq", kTopologyRing, 2, false};
  EXPECT_GT(ahead_posts(run(c, true, 256 * 400 + 13), c.n), 0) << "default";
  if (before) setenv("DYNAMIQ_SEND_AHEAD", saved.c_str(), 1); else unsetenv("DYNAMIQ_SEND_AHEAD");
}

}  // namespace
}  // namespace dynamiq

namespace dynamiq {
namespace {

// A bucket's local pass run ahead (precompute_local_pass, the hook's overlap
// of bucket k+1's statistics with bucket k's transfer): the call gives
// bit-identical results and bytes with it; a pass made for other data or
// another config is not used (the call runs its own); mode none has none.
TEST(PrecomputedLocalPass, SameResultsAndOnlyForItsOwnBucket) {
  const int n = 3;
  const int64_t numel = 256 * 120 + 13;
  for (const char* mode : {"dynamiq", "bitsplit", "lossless"}) {
    CollectiveConfig cfg;
    cfg.mode = mode_id(mode);
    cfg.block_bytes = 4096;
    // variant 0: no pass; 1: its own; 2: one made for another rank's data; 3: for another seed
    std::vector<std::vector<std::vector<float>>> out(4);
    std::vector<std::vector<CallStats>> st(4, std::vector<CallStats>(size_t(n)));
    for (int v = 0; v < 4; ++v) {
      out[size_t(v)].resize(size_t(n));
      for (int k = 0; k < n; ++k) out[size_t(v)][size_t(k)] = gaussian(size_t(numel), 900 + uint64_t(k));
      InprocWorld world(n, std::chrono::seconds(60));
      world.set_rendezvous_sends(true);
      world.set_accepts_shorter_messages(true);
      world.run([&](int k, Transport& tr) {
        CallArgs a;
        a.data = out[size_t(v)][size_t(k)].data();
        a.numel = numel;
        a.seq = 5;
        PrecomputedLocalPass pre;
        if (v > 0) {
          std::vector<float> other = gaussian(size_t(numel), 1);
          CallArgs b = a;
          if (v == 2) b.data = other.data();
          CollectiveConfig c2 = cfg;
          if (v == 3) c2.seed = 99;
          ASSERT_TRUE(precompute_local_pass(c2, b, pre));
          if (v == 2) pre.data = a.data;  // stats of other values claimed for this bucket: the test below
          a.local_pass = &pre;
        }
        st[size_t(v)][size_t(k)] = all_reduce(tr, cfg, a);
      });
    }
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(out[1][size_t(k)], out[0][size_t(k)]) << mode << " rank " << k;
      EXPECT_EQ(st[1][size_t(k)].bytes_sent, st[0][size_t(k)].bytes_sent) << mode;
      EXPECT_EQ(out[3][size_t(k)], out[0][size_t(k)]) << mode << " another config's pass was used";
    }
    // the driver trusts a pass for the same pointer, config, dtype and numel (the hook makes
    // it from the bucket it then passes): statistics of other values change the plan
    if (std::strcmp(mode, "dynamiq") == 0) EXPECT_NE(out[2][0], out[0][0]) << "the pass was not used";
  }
  CollectiveConfig none;
  std::vector<float> x(1000, 1.f);
  CallArgs a;
  a.data = x.data();
  a.numel = 1000;
  PrecomputedLocalPass pre;
  EXPECT_FALSE(precompute_local_pass(none, a, pre));
}

}  // namespace
}  // namespace dynamiq
