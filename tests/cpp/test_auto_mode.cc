// Mode "auto" (auto_mode.h) over the in-process transport:
//  - every rank takes the same decision on every bucket of a sequence
//    (sizes from tiny to 1 MB, state carried across calls), and ends
//    bit-identical;
//  - forced link extremes: infinite bandwidth picks none, a tiny one the
//    lossy mode (dynamiq, and bitsplit when it is auto_lossy);
//  - the result is bit for bit that of the chosen mode run directly;
//  - the first bucket of a group without a given bandwidth runs none;
//  - auto under topology hierarchical decides per inter-node ring;
//  - a reduce-scatter in mode auto raises on every rank;
//  - ranks that disagree on mode auto (some auto, some a fixed mode) raise the
//    "ranks disagree on mode" error on every rank, neither hang nor abort.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/auto_mode.h"
#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

std::vector<float> gauss(int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(numel));
  for (auto& e : v) e = d(g);
  return v;
}

CollectiveConfig auto_cfg(double bandwidth = 0.0, double latency = -1.0) {
  CollectiveConfig c;
  c.mode = kModeAuto;
  c.seed = 11;
  c.auto_bandwidth = bandwidth;
  c.auto_latency = latency;
  return c;
}

// Runs `sizes.size()` all-reduces per rank in order, one AutoState per rank
// kept across them; returns out[call][rank] and the stats.
struct Runs {
  std::vector<std::vector<std::vector<float>>> out;
  std::vector<std::vector<CallStats>> stats;
};
Runs run(const CollectiveConfig& cfg, int n, const std::vector<int64_t>& sizes, bool use_state = true) {
  Runs res;
  res.out.assign(sizes.size(), std::vector<std::vector<float>>(size_t(n)));
  res.stats.assign(sizes.size(), std::vector<CallStats>(size_t(n)));
  for (size_t i = 0; i < sizes.size(); ++i)
    for (int r = 0; r < n; ++r) res.out[i][size_t(r)] = gauss(sizes[i], uint32_t(1000 * i + r));
  InprocWorld world(n, std::chrono::seconds(60));
  world.run([&](int r, Transport& tr) {
    AutoState st;
    for (size_t i = 0; i < sizes.size(); ++i) {
      CallArgs a;
      a.data = res.out[i][size_t(r)].data();
      a.numel = sizes[i];
      a.seq = uint64_t(i);
      PlanState ps;
      a.plan_state = &ps;
      a.auto_state = use_state ? &st : nullptr;
      res.stats[i][size_t(r)] = all_reduce(tr, cfg, a);
    }
  });
  return res;
}

void expect_agreement(const Runs& r) {
  for (size_t i = 0; i < r.out.size(); ++i)
    for (size_t k = 1; k < r.out[i].size(); ++k) {
      EXPECT_EQ(r.stats[i][k].auto_choice, r.stats[i][0].auto_choice) << "call " << i << " rank " << k;
      ASSERT_EQ(std::memcmp(r.out[i][k].data(), r.out[i][0].data(), r.out[i][0].size() * sizeof(float)), 0)
          << "call " << i << " rank " << k;
    }
}

TEST(AutoMode, RanksAgreeOverASequence) {
  const std::vector<int64_t> sizes{1 << 18, 100, 1 << 18, 5000, 1 << 16, 1 << 18, 1 << 18};
  for (const int n : {2, 3, 4}) {
    const Runs r = run(auto_cfg(), n, sizes);
    expect_agreement(r);
    EXPECT_EQ(r.stats[0][0].auto_choice, int(kModeNone)) << "first bucket: no link measured yet";
    EXPECT_EQ(r.stats[1][0].auto_choice, int(kModeNone)) << "a bucket below min_compress_numel";
    // a slow (1 MB/s) and a fast link, latency from the header: the choice may be anything, but agreed
    expect_agreement(run(auto_cfg(1e6), n, sizes));
    expect_agreement(run(auto_cfg(1e10), n, sizes));
  }
}

// The chosen mode, run directly with the same config, seed and sequence numbers.
Runs direct(Mode m, int n, const std::vector<int64_t>& sizes) {
  CollectiveConfig c = auto_cfg();
  c.mode = m;
  return run(c, n, sizes, false);
}

TEST(AutoMode, ForcedExtremesAndSameBitsAsTheChosenMode) {
  const std::vector<int64_t> sizes{1 << 18, 1 << 16};
  const int n = 3;
  const Runs fast = run(auto_cfg(std::numeric_limits<double>::infinity(), 0.0), n, sizes);
  const Runs slow = run(auto_cfg(1e3, 0.0), n, sizes);  // 1 kB/s
  CollectiveConfig bs = auto_cfg(1e3, 0.0);
  bs.auto_lossy = mode_id("bitsplit");
  bs.params.set("bits", 4.0);
  const Runs slow_bs = run(bs, n, sizes);
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(fast.stats[i][0].auto_choice, int(kModeNone));
    EXPECT_EQ(slow.stats[i][0].auto_choice, int(mode_id("dynamiq")));
    EXPECT_EQ(slow.stats[i][0].path, Path::kCompressed);
    EXPECT_EQ(slow_bs.stats[i][0].auto_choice, int(mode_id("bitsplit")));
    EXPECT_GT(slow.stats[i][0].auto_predicted[0], slow.stats[i][0].auto_predicted[2]);
  }
  expect_agreement(fast);
  expect_agreement(slow);
  const Runs none = direct(kModeNone, n, sizes), dq = direct(mode_id("dynamiq"), n, sizes);
  for (size_t i = 0; i < sizes.size(); ++i)
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(std::memcmp(fast.out[i][size_t(r)].data(), none.out[i][size_t(r)].data(), sizes[i] * sizeof(float)), 0);
      ASSERT_EQ(std::memcmp(slow.out[i][size_t(r)].data(), dq.out[i][size_t(r)].data(), sizes[i] * sizeof(float)), 0);
    }
}

TEST(AutoMode, PredictionFollowsTheModel) {
  AutoState s;
  s.shared = true;
  s.bandwidth = 125e6;  // 1 Gbit/s
  s.latency = 1e-4;
  s.lossy = {2e-9, 10e-9, 5.0};
  s.lossless = {0.0, 20e-9, 28.0};
  CollectiveConfig c = auto_cfg();
  // 64 MB at 1 Gbit/s: the wire dominates, the lossy mode wins
  AutoPrediction p = auto_predict(s, c, 4, 16 << 20, DType::kF32);
  EXPECT_TRUE(p.predicted);
  EXPECT_EQ(p.modes[p.choice], mode_id("dynamiq"));
  EXPECT_NEAR(p.seconds[0], 6 * 1e-4 + 1.5 * (64 << 20) / 125e6, 1e-9);
  // 100 Gbit/s: the codec's kernels cost more than the bytes they save
  s.bandwidth = 12.5e9;
  p = auto_predict(s, c, 4, 16 << 20, DType::kF32);
  EXPECT_EQ(p.modes[p.choice], kModeNone);
  // a correction that says lossless runs 10x faster than modelled
  s.bandwidth = 1.25e9;
  s.correction[1] = 0.1;
  p = auto_predict(s, c, 4, 16 << 20, DType::kF32);
  EXPECT_EQ(p.modes[p.choice], mode_id("lossless"));
  // hysteresis: after none, lossless must be predicted > 10 % faster to take over
  s.last_choice = 0;
  s.correction[1] = 0.1;
  EXPECT_EQ(auto_predict(s, c, 4, 16 << 20, DType::kF32).choice, 1);
  s.correction[1] = p.seconds[0] / (p.seconds[1] / 0.1) * 0.95;  // lossless 5 % faster than none
  EXPECT_EQ(auto_predict(s, c, 4, 16 << 20, DType::kF32).choice, 0);
  s.last_choice = -1;
  EXPECT_EQ(auto_predict(s, c, 4, 16 << 20, DType::kF32).choice, 1);
}

TEST(AutoMode, ReprobesAModeThatHasNotRunForAWhile) {
  AutoState s;
  s.shared = true;
  s.bandwidth = 1.8e9;  // 14.4 Gbit/s: none predicted fastest, the lossy mode 1.36x its time
  s.latency = 1e-4;
  s.lossy = {1e-9, 2e-9, 5.0};
  s.lossless = {0.0, 20e-9, 28.0};
  const CollectiveConfig c = auto_cfg();
  const int64_t big = 16 << 20, small = 100 << 10;  // 64 MB and 400 KB of float32
  AutoPrediction p = auto_predict(s, c, 4, big, DType::kF32);
  ASSERT_EQ(p.choice, 0);
  ASSERT_FALSE(p.reprobe);
  const int lossy = 2;
  ASSERT_LE(p.seconds[lossy], kAutoReprobeSlack * p.seconds[0]) << "the test needs the lossy mode within the slack";
  s.since_run[lossy] = kAutoReprobeBuckets - 1;
  EXPECT_EQ(auto_predict(s, c, 4, big, DType::kF32).choice, 0) << "not yet";
  s.since_run[lossy] = kAutoReprobeBuckets;
  p = auto_predict(s, c, 4, big, DType::kF32);
  EXPECT_EQ(p.choice, lossy);
  EXPECT_TRUE(p.reprobe);
  EXPECT_EQ(auto_predict(s, c, 4, small, DType::kF32).choice, 0) << "a bucket below 1 MB measures nothing";
  // a mode predicted far slower than the choice is never re-probed
  s.correction[lossy] = 2.0 * kAutoReprobeSlack * p.seconds[0] / (p.seconds[lossy] / s.correction[lossy]);
  EXPECT_EQ(auto_predict(s, c, 4, big, DType::kF32).choice, 0);
}

// A long sequence of 1 MB buckets: the ranks take the same decisions (re-probes
// included, which depend on measured times: whether a mode is within the slack,
// and whether it then measures faster and takes over, varies with the machine's
// load) and end bit-identical; each of the two modes not chosen is re-probed at
// most once per kAutoReprobeBuckets.
TEST(AutoMode, ReprobeIsAgreedOverASequence) {
  const std::vector<int64_t> sizes(size_t(2 * kAutoReprobeBuckets + 4), 1 << 18);
  const Runs r = run(auto_cfg(1e12, 0.0), 2, sizes);
  expect_agreement(r);
  int lossy_runs = 0, reprobes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    lossy_runs += r.stats[i][0].auto_choice == int(mode_id("dynamiq"));
    reprobes += r.stats[i][0].auto_reprobe;
    EXPECT_EQ(r.stats[i][1].auto_reprobe, r.stats[i][0].auto_reprobe) << "call " << i;
  }
  std::printf("[ auto ] %d of %zu buckets ran the lossy mode, %d re-probes\n", lossy_runs, sizes.size(), reprobes);
  const int most = 2 * int((int64_t(sizes.size()) + kAutoReprobeBuckets - 1) / kAutoReprobeBuckets);
  EXPECT_LE(reprobes, most) << "re-probed more than once per " << kAutoReprobeBuckets << " buckets per mode";
}

TEST(AutoMode, HierarchicalDecidesPerInterNodeRing) {
  CollectiveConfig c = auto_cfg(1e3, 0.0);
  c.topology = kTopologyHierarchical;
  c.local_size = 2;
  const Runs r = run(c, 4, {1 << 18, 1 << 18});
  expect_agreement(r);
  EXPECT_EQ(r.stats[1][0].auto_choice, int(mode_id("dynamiq")));
  EXPECT_GT(r.stats[1][0].inter_bytes_sent, 0);
}

TEST(AutoMode, ReduceScatterRaisesOnEveryRank) {
  InprocWorld world(2, std::chrono::seconds(30));
  std::vector<std::string> errs(2);
  world.run([&](int r, Transport& tr) {
    std::vector<float> v(8192, 1.f), out(4096);
    CallArgs a;
    a.kind = Collective::kReduceScatter;
    a.data = v.data();
    a.output = out.data();
    a.numel = 8192;
    try {
      collective(tr, auto_cfg(), a);
    } catch (const Error& e) {
      errs[size_t(r)] = e.what();
    }
  });
  for (const auto& e : errs) EXPECT_NE(e.find("mode 'auto' runs all-reduces only"), std::string::npos) << e;
}

TEST(AutoMode, RanksThatDisagreeOnAutoRaiseOnEveryRank) {
  // which ranks run auto; the others run the fixed mode (the header of an auto rank
  // carries its numbers: without a header of one length on every rank, the
  // all-reduce of headers would have mismatched lengths)
  const std::vector<std::vector<bool>> layouts{{true, false}, {false, true}, {true, false, true}, {false, false, true}};
  for (const char* fixed : {"dynamiq", "none", "lossless"})
    for (const auto& is_auto : layouts) {
      const int n = int(is_auto.size());
      InprocWorld world(n, std::chrono::seconds(30));
      std::vector<std::string> errs(static_cast<size_t>(n));
      world.run([&](int r, Transport& tr) {
        CollectiveConfig c = auto_cfg(1e6, 0.0);
        if (!is_auto[size_t(r)]) c.mode = mode_id(fixed);
        std::vector<float> v = gauss(1 << 16, uint32_t(r));
        AutoState st;
        PlanState ps;
        CallArgs a;
        a.data = v.data();
        a.numel = int64_t(v.size());
        a.plan_state = &ps;
        a.auto_state = &st;
        try {
          all_reduce(tr, c, a);
        } catch (const Error& e) {
          errs[size_t(r)] = e.what();
        }
      });
      for (int r = 0; r < n; ++r)
        EXPECT_NE(errs[size_t(r)].find("ranks disagree on mode"), std::string::npos)
            << fixed << " n=" << n << " rank " << r << ": '" << errs[size_t(r)] << "'";
    }
}

}  // namespace
}  // namespace dynamiq
