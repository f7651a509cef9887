// Reduce-scatter and all-gather through the driver (collective.h, collective())
// over the in-process transport, every mode and topology, world sizes 1-6:
//  - integer inputs reduce-scatter to their exact sums in modes none and
//    lossless, lossless bit for bit as none, the input untouched, only this
//    rank's output written; shards the plan cuts directly, with a per-shard
//    unit, and padded (padded_shard);
//  - the lossy modes: every topology runs to the end under Gloo's rendezvous
//    sends and under NCCL's posting order (both of its models checked) with
//    the same bits as the eager transport, and the error stays small; the
//    bytes all ranks send add up to (n-1) times the plan's wire bytes on the
//    ring, two-step and butterfly on 2^k ranks (each chunk once per hop);
//  - all-gather is exact in none and lossless, and lossless sends each shard
//    compressed: fewer bytes than none on compressible data;
//  - errors reach every rank: a bucket that does not split into shards, a
//    lossy all-gather, ranks running different collectives.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"

namespace dynamiq {
namespace {

std::vector<float> ints(int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<float> v(static_cast<size_t>(numel));
  for (auto& e : v) e = float(d(g));
  return v;
}

std::vector<float> gauss(int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(numel));
  for (auto& e : v) e = d(g);
  return v;
}

CollectiveConfig cfg_of(Mode m, Topology t) {
  CollectiveConfig c;
  c.mode = m;
  c.topology = t;
  c.seed = 9;
  c.block_bytes = 2048;  // several blocks per chunk
  c.window_bytes = 8192;
  c.min_compress_numel = 0;
  return c;
}

struct World {
  bool rendezvous = false, ordered = false;
  std::string violations;  // NCCL models (ordered only)
};

// Reduce-scatter of in[r] (n shards of `shard` elements each, zero-padded to
// padded_shard) on every rank; returns each rank's shard.
std::vector<std::vector<float>> reduce_scatter(int n, const CollectiveConfig& cfg, const std::vector<std::vector<float>>& in,
                                               int64_t shard, ReduceOp op, World& w, std::vector<CallStats>* stats = nullptr) {
  const int64_t mp = padded_shard(cfg, Collective::kReduceScatter, n, shard);
  EXPECT_GE(mp, shard);
  std::vector<std::vector<float>> staged(static_cast<size_t>(n), std::vector<float>(size_t(n * mp), 0.f));
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      std::copy_n(in[size_t(r)].begin() + c * shard, shard, staged[size_t(r)].begin() + c * mp);
  const auto before = staged;
  // guard elements around each output catch writes outside this rank's shard
  std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(size_t(mp + 64), -7.f));
  if (stats) stats->assign(size_t(n), CallStats{});
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_rendezvous_sends(w.rendezvous);
  world.set_posts_in_order(w.ordered);
  world.set_accepts_shorter_messages(!w.ordered);  // as Gloo
  world.run([&](int r, Transport& tr) {
    CallArgs a;
    a.kind = Collective::kReduceScatter;
    a.data = staged[size_t(r)].data();
    a.output = out[size_t(r)].data() + 32;
    a.numel = n * mp;
    a.op = op;
    a.seq = 3;
    const CallStats cs = collective(tr, cfg, a);
    if (stats) (*stats)[size_t(r)] = cs;
  });
  if (w.ordered) {
    const auto v = world.nccl_order_violations();
    w.violations = (v.empty() ? "" : v[0]) + world.nccl_stream_deadlock();
  }
  EXPECT_EQ(staged, before) << "the input was modified";
  std::vector<std::vector<float>> res(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < 32; ++k) {
      EXPECT_EQ(out[size_t(r)][size_t(k)], -7.f) << "write before the output, rank " << r;
      EXPECT_EQ(out[size_t(r)][size_t(32 + mp + k)], -7.f) << "write after the output, rank " << r;
    }
    res[size_t(r)].assign(out[size_t(r)].begin() + 32, out[size_t(r)].begin() + 32 + shard);
  }
  return res;
}

// All-gather of each rank's shard (`shard` elements): returns each rank's n * shard result.
std::vector<std::vector<float>> all_gather(int n, const CollectiveConfig& cfg, const std::vector<std::vector<float>>& in,
                                           int64_t shard, World& w, std::vector<CallStats>* stats = nullptr) {
  const int64_t mp = padded_shard(cfg, Collective::kAllGather, n, shard);
  std::vector<std::vector<float>> buf(static_cast<size_t>(n), std::vector<float>(size_t(n * mp), -1.f));
  for (int r = 0; r < n; ++r) {
    std::fill_n(buf[size_t(r)].begin() + r * mp, mp, 0.f);
    std::copy_n(in[size_t(r)].begin(), shard, buf[size_t(r)].begin() + r * mp);
  }
  if (stats) stats->assign(size_t(n), CallStats{});
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_rendezvous_sends(w.rendezvous);
  world.set_posts_in_order(w.ordered);
  world.set_accepts_shorter_messages(!w.ordered);
  world.run([&](int r, Transport& tr) {
    CallArgs a;
    a.kind = Collective::kAllGather;
    a.data = buf[size_t(r)].data();
    a.numel = n * mp;
    a.seq = 4;
    const CallStats cs = collective(tr, cfg, a);
    if (stats) (*stats)[size_t(r)] = cs;
  });
  if (w.ordered) {
    const auto v = world.nccl_order_violations();
    w.violations = (v.empty() ? "" : v[0]) + world.nccl_stream_deadlock();
  }
  std::vector<std::vector<float>> res(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      res[size_t(r)].insert(res[size_t(r)].end(), buf[size_t(r)].begin() + c * mp, buf[size_t(r)].begin() + c * mp + shard);
  return res;
}

TEST(ReduceScatter, ExactModesSumExactlyAndLosslessEqualsNone) {
  for (Topology t : schedule_topologies(Collective::kReduceScatter))
    for (int n = 1; n <= 6; ++n)
      for (int64_t shard : {int64_t(1280), int64_t(333), int64_t(4099), int64_t(1)})
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
          SCOPED_TRACE(std::string(topology_name(t)) + " n=" + std::to_string(n) + " shard=" +
                       std::to_string(shard) + (op == ReduceOp::kMean ? " mean" : " sum"));
          std::vector<std::vector<float>> in;
          for (int r = 0; r < n; ++r) in.push_back(ints(n * shard, 17 * uint32_t(r) + uint32_t(shard)));
          World w;
          const auto none = reduce_scatter(n, cfg_of(mode_id("none"), t), in, shard, op, w);
          const auto ll = reduce_scatter(n, cfg_of(mode_id("lossless"), t), in, shard, op, w);
          for (int r = 0; r < n; ++r) {
            for (int64_t i = 0; i < shard; ++i) {
              float s = 0;
              for (int q = 0; q < n; ++q) s += in[size_t(q)][size_t(r * shard + i)];
              if (op == ReduceOp::kMean) s /= float(n);
              ASSERT_EQ(none[size_t(r)][size_t(i)], s) << "rank " << r << " element " << i;
            }
            ASSERT_EQ(0, std::memcmp(none[size_t(r)].data(), ll[size_t(r)].data(), size_t(shard) * 4)) << "rank " << r;
          }
        }
}

TEST(ReduceScatter, LossyModesUnderRendezvousAndNcclOrderGiveTheSameBits) {
  for (Mode m : {mode_id("dynamiq"), mode_id("bitsplit"), mode_id("lossless")})
    for (Topology t : schedule_topologies(Collective::kReduceScatter))
      for (int n = 2; n <= 6; ++n) {
        SCOPED_TRACE(std::string(mode_name(m)) + " " + topology_name(t) + " n=" + std::to_string(n));
        const int64_t shard = 2048 + 37;  // padded for dynamiq and bitsplit
        std::vector<std::vector<float>> in;
        for (int r = 0; r < n; ++r) in.push_back(gauss(n * shard, 100 + uint32_t(r)));
        const CollectiveConfig cfg = cfg_of(m, t);
        World eager, rv, ord;
        rv.rendezvous = true;
        ord.ordered = true;
        std::vector<CallStats> st;
        const auto a = reduce_scatter(n, cfg, in, shard, ReduceOp::kMean, eager, &st);
        const auto b = reduce_scatter(n, cfg, in, shard, ReduceOp::kMean, rv);
        const auto c = reduce_scatter(n, cfg, in, shard, ReduceOp::kMean, ord);
        EXPECT_EQ(ord.violations, "");
        double err = 0, ref2 = 0;
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(a[size_t(r)], b[size_t(r)]) << "rendezvous sends changed rank " << r;
          ASSERT_EQ(a[size_t(r)], c[size_t(r)]) << "ordered posting changed rank " << r;
          for (int64_t i = 0; i < shard; ++i) {
            double s = 0;
            for (int q = 0; q < n; ++q) s += in[size_t(q)][size_t(r * shard + i)];
            s /= n;
            err += (a[size_t(r)][size_t(i)] - s) * (a[size_t(r)][size_t(i)] - s);
            ref2 += s * s;
          }
        }
        EXPECT_LT(err / ref2, m == mode_id("lossless") ? 1e-12 : 0.05);
        EXPECT_EQ(st[0].path, Path::kCompressed);
        // each chunk crosses n-1 hops: all ranks together send (n-1) x the plan's wire bytes
        if (m != mode_id("lossless") && (t != topology_id("butterfly") || (n & (n - 1)) == 0)) {
          int64_t total = 0;
          for (const CallStats& s : st) total += s.bytes_sent;
          const int64_t numel = n * padded_shard(cfg, Collective::kReduceScatter, n, shard);
          EXPECT_NEAR(double(total), double(n - 1) * st[0].bits_per_coord * double(numel) / 8.0, 0.5);
        }
      }
}

TEST(AllGather, ExactInNoneAndLosslessUnderEveryPosting) {
  for (Topology t : schedule_topologies(Collective::kAllGather))
    for (int n = 1; n <= 6; ++n)
      for (int64_t shard : {int64_t(3000), int64_t(4099), int64_t(7)}) {
        SCOPED_TRACE(std::string(topology_name(t)) + " n=" + std::to_string(n) + " shard=" + std::to_string(shard));
        std::vector<std::vector<float>> in;
        std::vector<float> want;
        for (int r = 0; r < n; ++r) {
          std::vector<float> x = gauss(shard, 7 + uint32_t(r));
          for (auto& v : x) v = std::ldexp(std::round(v * 64.f), -6);  // few exponents: compressible
          in.push_back(x);
          want.insert(want.end(), x.begin(), x.end());
        }
        for (Mode m : {mode_id("none"), mode_id("lossless")}) {
          World eager, rv, ord;
          rv.rendezvous = true;
          ord.ordered = true;
          std::vector<CallStats> st;
          const auto a = all_gather(n, cfg_of(m, t), in, shard, eager, &st);
          const auto b = all_gather(n, cfg_of(m, t), in, shard, rv);
          const auto c = all_gather(n, cfg_of(m, t), in, shard, ord);
          EXPECT_EQ(ord.violations, "");
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(a[size_t(r)], want) << mode_name(m) << " rank " << r;
            ASSERT_EQ(b[size_t(r)], want) << mode_name(m) << " rank " << r;
            ASSERT_EQ(c[size_t(r)], want) << mode_name(m) << " rank " << r;
          }
          if (m == mode_id("lossless") && n > 1 && shard > 1000) {
            const int64_t raw = int64_t(n - 1) * n * shard * 4;
            int64_t total = 0;
            for (const CallStats& s : st) total += s.bytes_sent;
            EXPECT_LT(total, raw) << "lossless sends each shard compressed";
          }
        }
      }
}

std::vector<std::string> errors_of(int n, const std::function<void(int, Transport&)>& fn) {
  std::vector<std::string> errs(static_cast<size_t>(n));
  InprocWorld world(n, std::chrono::seconds(20));
  world.run([&](int r, Transport& tr) {
    try {
      fn(r, tr);
    } catch (const Error& e) {
      errs[size_t(r)] = e.what();
    }
  });
  return errs;
}

TEST(ReduceScatter, ErrorsReachEveryRank) {
  const int n = 3;
  std::vector<float> buf(3001), out(1001);
  // a bucket that does not split into 3 shards (every rank)
  for (const auto& e : errors_of(n, [&](int, Transport& tr) {
         CallArgs a;
         a.kind = Collective::kReduceScatter;
         a.data = buf.data();
         a.output = out.data();
         a.numel = 3001;
         collective(tr, cfg_of(mode_id("dynamiq"), kTopologyRing), a);
       }))
    EXPECT_NE(e.find("equal shards"), std::string::npos) << e;
  // a lossy all-gather
  for (const auto& e : errors_of(n, [&](int, Transport& tr) {
         CallArgs a;
         a.kind = Collective::kAllGather;
         a.data = buf.data();
         a.numel = 3000;
         collective(tr, cfg_of(mode_id("dynamiq"), kTopologyRing), a);
       }))
    EXPECT_NE(e.find("all-gather"), std::string::npos) << e;
  // one rank reduce-scatters, the others all-reduce
  const auto errs = errors_of(n, [&](int r, Transport& tr) {
    std::vector<float> x(3072), y(1024);
    CallArgs a;
    a.kind = r == 1 ? Collective::kReduceScatter : Collective::kAllReduce;
    a.data = x.data();
    a.output = y.data();
    a.numel = 3072;
    collective(tr, cfg_of(mode_id("none"), kTopologyRing), a);
  });
  for (const auto& e : errs) EXPECT_NE(e.find("collective (all-reduce, reduce-scatter"), std::string::npos) << e;
  // a reported shape error aborts every rank with the collective's name
  const auto shape = errors_of(n, [&](int r, Transport& tr) {
    std::vector<float> x(3072), y(1024);
    CallArgs a;
    a.kind = Collective::kReduceScatter;
    a.data = x.data();
    a.output = y.data();
    a.numel = 3072;
    if (r == 2) a.local_error = InputError::kShape;
    collective(tr, cfg_of(mode_id("none"), kTopologyRing), a);
  });
  for (const auto& e : shape) EXPECT_NE(e.find("dynamiq reduce-scatter aborted on every rank"), std::string::npos) << e;
}

// padded_shard: the shard itself when the plan can cut it, else a padded size
// that the compressed plan and the exact path's identity plan both cut.
TEST(ReduceScatter, PaddedShardIsCutByEveryPath) {
  for (Mode m : {mode_id("none"), mode_id("lossless"), mode_id("dynamiq"), mode_id("bitsplit")})
    for (int n : {1, 2, 3, 5})
      for (int64_t shard : {int64_t(0), int64_t(1), int64_t(255), int64_t(256), int64_t(4096), int64_t(4099),
                            int64_t(100003), int64_t(1) << 20}) {
        CollectiveConfig cfg = cfg_of(m, kTopologyRing);
        const int64_t p = padded_shard(cfg, Collective::kReduceScatter, n, shard);
        ASSERT_GE(p, shard);
        EXPECT_GT(identity_shard_unit(p), 0) << mode_name(m) << " " << shard;
        if (m == mode_id("dynamiq") && n > 1 && shard >= 256) {
          EXPECT_EQ(p % 256, 0) << shard;
          EXPECT_LT(p - shard, 256);
        }
        if (m == mode_id("none") && identity_shard_unit(shard) > 0) EXPECT_EQ(p, shard);
      }
}

}  // namespace
}  // namespace dynamiq
