// Topology "hierarchical" (hierarchical.h) through the driver over the
// in-process transport:
//  - modes none and lossless (intra-node none or lossless) sum integer inputs
//    exactly and float inputs to the double-precision sum within float32
//    summation error; lossless is bit-identical to hierarchical none; every
//    rank ends bit-identical; sizes that need padding, one node, one rank per
//    node, mean, bf16, under Gloo's rendezvous sends and NCCL's posting order;
//  - dynamiq over 2 nodes of 2 ranks has a lower vNMSE than flat ring dynamiq
//    on the same 4 ranks (mean over seeds);
//  - a bad local_size (not dividing the world, unset, different per rank),
//    a lossy intra_mode and a reduce-scatter raise on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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

std::vector<float> ints(int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<float> v(static_cast<size_t>(numel));
  for (auto& e : v) e = float(d(g));
  return v;
}

CollectiveConfig hier(Mode mode, int local_size, Mode intra = kModeNone) {
  CollectiveConfig c;
  c.mode = mode;
  c.topology = kTopologyHierarchical;
  c.local_size = local_size;
  c.intra_mode = intra;
  c.seed = 5;
  c.block_bytes = 4096;  // several blocks per chunk
  c.window_bytes = 16384;
  c.min_compress_numel = 0;
  return c;
}

struct Opts {
  bool rendezvous = false, ordered = false;
  ReduceOp op = ReduceOp::kSum;
};

// Each rank's in[r] all-reduced in place; returns the buffers.
std::vector<std::vector<float>> run(const std::vector<CollectiveConfig>& cfgs, std::vector<std::vector<float>> in,
                                    Opts o = {}, std::vector<CallStats>* stats = nullptr) {
  const int n = int(in.size());
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_rendezvous_sends(o.rendezvous);
  world.set_posts_in_order(o.ordered);
  if (stats) stats->assign(size_t(n), CallStats{});
  world.run([&](int r, Transport& tr) {
    CallArgs a;
    a.data = in[size_t(r)].data();
    a.numel = int64_t(in[size_t(r)].size());
    a.op = o.op;
    a.seq = 3;
    PlanState ps;
    a.plan_state = &ps;
    CallStats s = all_reduce(tr, cfgs[size_t(r) % cfgs.size()], a);
    if (stats) (*stats)[size_t(r)] = s;
  });
  if (o.ordered) {
    EXPECT_TRUE(world.nccl_order_violations().empty());
    EXPECT_EQ(world.nccl_stream_deadlock(), "");
  }
  return in;
}

std::vector<std::vector<float>> inputs(int n, int64_t numel, bool integer, uint32_t seed = 1) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < n; ++r) in.push_back(integer ? ints(numel, seed + r) : gauss(numel, seed + 100 * r));
  return in;
}

void expect_identical_ranks(const std::vector<std::vector<float>>& out) {
  for (size_t r = 1; r < out.size(); ++r)
    ASSERT_EQ(std::memcmp(out[r].data(), out[0].data(), out[0].size() * sizeof(float)), 0) << "rank " << r;
}

struct Shape {
  int n, k;
  int64_t numel;
};

TEST(Hierarchical, ExactModesSumExactlyAndLosslessMatchesNone) {
  const Mode lossless = mode_id("lossless");
  for (const Shape sh : {Shape{4, 2, 20000}, Shape{4, 2, 10007}, Shape{6, 3, 33333}, Shape{6, 2, 4099},
                         Shape{4, 4, 9000}, Shape{4, 1, 9000}, Shape{2, 2, 7}}) {
    for (const bool integer : {true, false}) {
      SCOPED_TRACE("n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) + " numel=" +
                   std::to_string(sh.numel) + (integer ? " ints" : " gauss"));
      const auto in = inputs(sh.n, sh.numel, integer);
      const auto none = run({hier(kModeNone, sh.k)}, in);
      expect_identical_ranks(none);
      for (int64_t i = 0; i < sh.numel; ++i) {
        double sum = 0, mag = 0;
        for (int r = 0; r < sh.n; ++r) sum += in[size_t(r)][size_t(i)], mag += std::fabs(in[size_t(r)][size_t(i)]);
        if (integer)
          ASSERT_EQ(none[0][size_t(i)], float(sum)) << i;
        else
          ASSERT_NEAR(none[0][size_t(i)], sum, 1e-6 * sh.n * mag + 1e-30) << i;
      }
      for (const Mode intra : {kModeNone, lossless}) {
        const auto ll = run({hier(lossless, sh.k, intra)}, in);
        ASSERT_EQ(std::memcmp(ll[0].data(), none[0].data(), size_t(sh.numel) * sizeof(float)), 0)
            << "lossless (intra " << mode_name(intra) << ") differs from none";
        expect_identical_ranks(ll);
      }
    }
  }
}

TEST(Hierarchical, PostingModelsAndMean) {
  const auto in = inputs(4, 50000, true, 7);
  const auto ref = run({hier(kModeNone, 2)}, in);
  for (const bool rendezvous : {false, true})
    for (const bool ordered : {false, true}) {
      Opts o;
      o.rendezvous = rendezvous;
      o.ordered = ordered;
      const auto out = run({hier(mode_id("lossless"), 2, mode_id("lossless"))}, in, o);
      ASSERT_EQ(std::memcmp(out[0].data(), ref[0].data(), ref[0].size() * sizeof(float)), 0);
      expect_identical_ranks(out);
      run({hier(mode_id("dynamiq"), 2)}, inputs(4, 50000, false), o);  // runs to the end
    }
  Opts mean;
  mean.op = ReduceOp::kMean;
  const auto m = run({hier(kModeNone, 2)}, in, mean);
  for (size_t i = 0; i < ref[0].size(); ++i) ASSERT_EQ(m[0][i], ref[0][i] / 4.f) << i;
}

double vnmse(const std::vector<std::vector<float>>& in, const std::vector<float>& out) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    double s = 0;
    for (const auto& v : in) s += v[i];
    err += (out[i] - s) * (out[i] - s);
    norm += s * s;
  }
  return err / norm;
}

TEST(Hierarchical, DynamiqErrorBelowFlatOnTwoNodes) {
  const Mode dq = mode_id("dynamiq");
  double e_hier = 0, e_flat = 0;
  const int seeds = 5;
  for (int s = 0; s < seeds; ++s) {
    const auto in = inputs(4, 1 << 16, false, 1000u + uint32_t(s));
    CollectiveConfig h = hier(dq, 2), f = h;
    h.seed = f.seed = uint64_t(s);
    f.topology = kTopologyRing;
    f.local_size = 0;
    std::vector<CallStats> hs;
    const auto oh = run({h}, in, {}, &hs);
    const auto of = run({f}, in);
    expect_identical_ranks(oh);
    EXPECT_EQ(hs[0].path, Path::kCompressed);
    EXPECT_GT(hs[0].inter_bytes_sent, 0);
    e_hier += vnmse(in, oh[0]) / seeds;
    e_flat += vnmse(in, of[0]) / seeds;
  }
  RecordProperty("vnmse_hier", std::to_string(e_hier));
  RecordProperty("vnmse_flat", std::to_string(e_flat));
  std::printf("vNMSE 4 ranks, dynamiq 5 bits: hierarchical 2x2 %.4g, flat ring %.4g\n", e_hier, e_flat);
  EXPECT_LT(e_hier, e_flat);
}

// Runs on every rank and expects every rank to throw an error containing `what`.
void expect_all_raise(const std::vector<CollectiveConfig>& cfgs, int n, const std::string& what,
                      Collective kind = Collective::kAllReduce) {
  InprocWorld world(n, std::chrono::seconds(30));
  std::vector<std::string> errs(static_cast<size_t>(n));
  world.run([&](int r, Transport& tr) {
    std::vector<float> v(size_t(8192 * n), 1.f), out(8192, 0.f);
    CallArgs a;
    a.data = v.data();
    a.numel = int64_t(v.size());
    a.kind = kind;
    a.output = out.data();
    try {
      collective(tr, cfgs[size_t(r) % cfgs.size()], a);
    } catch (const Error& e) {
      errs[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_NE(errs[size_t(r)].find(what), std::string::npos) << "rank " << r << ": " << errs[size_t(r)];
}

TEST(Hierarchical, BadConfigRaisesOnEveryRank) {
  expect_all_raise({hier(kModeNone, 3)}, 4, "does not divide");
  expect_all_raise({hier(kModeNone, 0)}, 4, "local_size");
  expect_all_raise({hier(kModeNone, 2), hier(kModeNone, 4)}, 4, "local_size");
  expect_all_raise({hier(kModeNone, 2, mode_id("dynamiq"))}, 4, "intra_mode");
  expect_all_raise({hier(kModeNone, 2)}, 4, "all-reduces only", Collective::kReduceScatter);
}

}  // namespace
}  // namespace dynamiq
