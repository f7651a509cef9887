// The reduce-scatter's error on a rank's shard against the all-reduce's on
// the same shard and inputs (issue 44), over the in-process transport: every
// registered lossy mode (kernels/registry.h registered_modes(), less the
// exact schemes; a new mode is covered by registering it), every topology
// that runs a reduce-scatter (ring, butterfly, two-step), n = 2..8.
//
// An all-reduce is a reduction plus one compression of each owner's sum,
// whose bytes every rank decodes. The reduce-scatter's sink keeps its sum as
// it is (ExecArgs::sink_writes_sum): n - 1 compressions per coordinate
// against the all-reduce's n, the one left out being the largest (the whole
// sum, at the same width). Ring and two-step reduce a shard along the same
// tree in both collectives; a butterfly with extra ranks (n = 3, 5, 6, 7)
// brings an extra rank's shard to it as a partial sum of n - 1 ranks, which
// costs about what the all-reduce's final compression of n ranks does. So the
// reduce-scatter's mean squared error on a shard is below the all-reduce's in
// expectation, and the test asks for exactly that: per shard, summed over
// kTrials inputs (and keys), RS <= AR. At these seeds the ratio RS / AR is
// 0.31-0.90; over 8 sets of seeds (inputs and keys; DynamiQ's octet RNG
// layout) 0.29-0.99, the closest to 1 dynamiq's butterfly extra shards, mean
// 0.84-0.88 with a standard deviation of 0.02-0.04 per shard (one set gave
// 0.987 at n = 6), and bounded at n = 8, 0.877 ~ (n-1)/n, sd 0.004. Before
// the fix the sink compressed its sum as well: ratios 0.93-1.04 (dynamiq) or
// exactly 1 (bitsplit, bounded) on ring and two-step, and up to 1.42 on the
// butterfly's extra shards: the test fails.
//
// Mode bounded is also held to its per-coordinate bounds, exactly:
// |RS - sum| <= (n-1) e and |AR - sum| <= n e (bounded_compressions); the
// data are on a grid of 2^-12 and e is a power of two, so every float32 sum
// is exact. DYNAMIQ_TEST_VERBOSE=1 prints the ratios.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/topology.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/bounded/bounded_codec.h"
#include "kernels/registry.h"
#include "params_util.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

constexpr int kTrials = 8;
constexpr int64_t kShard = 2048;   // 8 dynamiq super-groups, 2 bit-split units: no padding
constexpr double kGrid = 0x1p-12;  // every input value is a multiple of it
constexpr double kBound = 0x1p-8;  // mode bounded's e
constexpr double kClip = 10.0;  // |t| above it is clipped (0.2 % of Student-t(3) values)

// Gradient-like data (after python/dynamiq/bench.py gradient_like): a shared
// Student-t(3) component (0.3 x, the same on every rank) plus each rank's own,
// in "layers" of 256-2048 values whose scale is 2^-3..2^0, clipped at |t| = kClip
// and rounded to a grid of 2^-12 (so that float32 sums of up to 8 ranks'
// values, and of mode bounded's decoded values, are exact).
std::vector<std::vector<float>> gradient_like(int n, int64_t numel, uint32_t seed) {
  std::mt19937_64 shared(uint64_t(seed) * 1000003u + 17u);
  auto t3 = [](std::mt19937_64& g) {
    std::normal_distribution<double> z;
    const double a = z(g), b = z(g), c = z(g), d = z(g);
    return std::clamp(a / std::sqrt((b * b + c * c + d * d) / 3.0), -kClip, kClip);
  };
  std::vector<double> common(static_cast<size_t>(numel)), scale(static_cast<size_t>(numel));
  for (auto& v : common) v = 0.3 * t3(shared);
  std::uniform_int_distribution<int> len(256, 2048), exp2(-3, 0);
  for (int64_t s = 0; s < numel;) {
    const int64_t e = std::min(numel, s + len(shared));
    const double sc = std::ldexp(1.0, exp2(shared));
    for (int64_t i = s; i < e; ++i) scale[size_t(i)] = sc;
    s = e;
  }
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(numel)));
  for (int r = 0; r < n; ++r) {
    std::mt19937_64 own(uint64_t(seed) * 1000003u + 1009u * uint64_t(r + 1));
    for (int64_t i = 0; i < numel; ++i) {
      const double v = std::clamp(common[size_t(i)] + t3(own), -kClip, kClip) * scale[size_t(i)];
      x[size_t(r)][size_t(i)] = float(std::nearbyint(v / kGrid) * kGrid);
    }
  }
  return x;
}

struct ShardErrors {
  std::vector<double> rs, ar;  // per shard: sum of squared errors
  double rs_max = 0, ar_max = 0;  // largest |error| of any coordinate
};

// One reduce-scatter and one all-reduce of `in` (n shards of kShard values
// per rank, the same key), sum; adds each shard's squared errors to `e`.
void run_both(int n, const CollectiveConfig& cfg, const std::vector<std::vector<float>>& in, uint64_t seq,
              ShardErrors& e) {
  ASSERT_EQ(padded_shard(cfg, Collective::kReduceScatter, n, kShard), kShard);
  const int64_t numel = n * kShard;
  std::vector<double> truth(static_cast<size_t>(numel), 0.0);
  for (const auto& v : in)
    for (int64_t i = 0; i < numel; ++i) truth[size_t(i)] += double(v[size_t(i)]);
  std::vector<std::vector<float>> rs(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(kShard)));
  std::vector<std::vector<float>> ar = in;
  std::vector<CallStats> st(static_cast<size_t>(2 * n));
  for (Collective kind : {Collective::kReduceScatter, Collective::kAllReduce}) {
    InprocWorld world(n, std::chrono::seconds(60));
    world.run([&](int r, Transport& tr) {
      CallArgs a;
      a.kind = kind;
      a.data = kind == Collective::kAllReduce ? ar[size_t(r)].data() : const_cast<float*>(in[size_t(r)].data());
      a.output = rs[size_t(r)].data();
      a.numel = numel;
      a.seq = seq;
      st[size_t(r + (kind == Collective::kAllReduce ? n : 0))] = collective(tr, cfg, a);
    });
  }
  for (const CallStats& s : st) ASSERT_EQ(s.path, Path::kCompressed);
  e.rs.resize(size_t(n), 0.0);
  e.ar.resize(size_t(n), 0.0);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < kShard; ++i) {
      const double t = truth[size_t(r * kShard + i)];
      const double a = double(rs[size_t(r)][size_t(i)]) - t, b = double(ar[size_t(r)][size_t(r * kShard + i)]) - t;
      e.rs[size_t(r)] += a * a;
      e.ar[size_t(r)] += b * b;
      e.rs_max = std::max(e.rs_max, std::fabs(a));
      e.ar_max = std::max(e.ar_max, std::fabs(b));
    }
}

// The registered modes that lose information, each with a config it accepts.
std::vector<CollectiveConfig> lossy_configs() {
  std::vector<CollectiveConfig> out;
  for (const ModeInfo& m : registered_modes()) {
    CollectiveConfig c;
    c.mode = m.id;
    set_if_declared(m.id, c.params, "bits", num_value(5.0));
    set_if_declared(m.id, c.params, "error_bound", num_value(kBound));  // mode bounded needs a bound
    c.seed = 44;
    c.min_compress_numel = 0;
    c.block_bytes = 0;
    if (!make_scheme(c)->exact()) out.push_back(c);
  }
  return out;
}

TEST(ReduceScatterError, NoLargerThanTheAllReducesOnTheSameShard) {
  const auto cfgs = lossy_configs();
  ASSERT_GE(cfgs.size(), 3u) << "dynamiq, bitsplit and bounded at least";
  const std::vector<Topology> topos = schedule_topologies(Collective::kReduceScatter);
  ASSERT_GE(topos.size(), 3u) << "ring, butterfly and two-step at least";
  const size_t nt = topos.size();
  const bool verbose = std::getenv("DYNAMIQ_TEST_VERBOSE") != nullptr;
  for (int n = 2; n <= 8; ++n) {
    std::vector<ShardErrors> e(cfgs.size() * nt);  // per (mode, topology)
    for (int k = 0; k < kTrials; ++k) {
      const auto in = gradient_like(n, n * kShard, uint32_t(1000 * n + k));
      for (size_t m = 0; m < cfgs.size(); ++m)
        for (size_t t = 0; t < nt; ++t) {
          CollectiveConfig cfg = cfgs[m];
          cfg.topology = topos[t];
          SCOPED_TRACE(std::string(mode_name(cfg.mode)) + " " + topology_name(cfg.topology) + " n=" + std::to_string(n));
          run_both(n, cfg, in, uint64_t(k), e[m * nt + t]);
          if (HasFatalFailure()) return;
        }
    }
    for (size_t m = 0; m < cfgs.size(); ++m)
      for (size_t t = 0; t < nt; ++t) {
        const std::string what =
            std::string(mode_name(cfgs[m].mode)) + " " + topology_name(topos[t]) + " n=" + std::to_string(n);
        SCOPED_TRACE(what);
        const ShardErrors& s = e[m * nt + t];
        if (verbose) std::printf("%-22s RS / AR per shard:", what.c_str());
        for (int r = 0; r < n; ++r) {
          const double ratio = s.rs[size_t(r)] / s.ar[size_t(r)];
          if (verbose) std::printf(" %.3f", ratio);
          EXPECT_GT(s.ar[size_t(r)], 0.0) << "shard " << r << ": the all-reduce made no error";
          EXPECT_LE(ratio, 1.0) << "shard " << r << ": mean squared error " << s.rs[size_t(r)] / (kTrials * kShard)
                                  << " (reduce-scatter) against " << s.ar[size_t(r)] / (kTrials * kShard)
                                  << " (all-reduce)";
        }
        if (verbose) std::printf("\n");
        if (cfgs[m].params.has("error_bound")) {
          EXPECT_LE(s.rs_max, bounded_compressions(int(Collective::kReduceScatter), n) * kBound);
          EXPECT_LE(s.ar_max, bounded_compressions(int(Collective::kAllReduce), n) * kBound);
        }
      }
  }
}

// The sink's call fused (dynamiq, bitsplit) writes the bits of the default,
// Codec::decompress_accumulate_output: decompress_accumulate, then store_unit
// per unit (bias added back, divided, rounded to the dtype).
TEST(ReduceScatterError, FusedSinkSumEqualsTheDefault) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    DynamiqParams prm;
    const DynamiqCodec dq(prm);
    const BitsplitCodec bs(BitsplitParams{5, 128, false, true});
    const std::pair<const Codec*, Plan> cases[] = {
        {&dq, dqtest::mixed_width_plan(dt, 256 * 12 + 40, prm.fmt)},
        {&bs, bs.make_plan(dt, 1024 * 5 + 77, 1)}};
    for (const auto& [codec, plan] : cases) {
      SCOPED_TRACE(codec->name() + " " + dtype_name(dt));
      const auto in = dqtest::shifted_gaussian_buckets(2, dt, plan.numel, 8);
      const Block b{1, plan.num_units};
      Local x0, x1;
      x0.bucket = in[0].data();
      x1.bucket = in[1].data();
      std::vector<uint8_t> msg(codec->max_message_bytes(plan, b));
      msg.resize(codec->compress(x0, plan, b, dqtest::rng_ctx(1, 2), msg.data()));
      for (float divisor : {1.0f, 3.0f}) {
        std::vector<uint8_t> fused(in[0].size(), 0), plain(in[0].size(), 0);
        Output y;
        y.bias_scale = 2.0f;
        y.divisor = divisor;
        y.bucket = fused.data();
        codec->decompress_accumulate_output(msg.data(), msg.size(), x1, plan, b, y);
        y.bucket = plain.data();
        codec->Codec::decompress_accumulate_output(msg.data(), msg.size(), x1, plan, b, y);
        EXPECT_EQ(fused, plain) << "divisor " << divisor;
        EXPECT_NE(fused, std::vector<uint8_t>(fused.size(), 0));
      }
    }
  }
}

}  // namespace
}  // namespace dynamiq
