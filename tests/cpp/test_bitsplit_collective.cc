// Mode "bitsplit" through the collective driver over the in-process
// transport: every rank ends bit-identical, the bytes on the wire are the
// table 4 accounting of the blocks each rank sends, twostep's error does not
// grow with the world size the way ring's does, non-finite input takes the
// exact path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "hook/collective/schedule.h"
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/base/float_bits.h"
#include "test_bitsplit_util.h"
#include "params_util.h"

namespace dynamiq {
namespace {

using namespace bstest;

struct Setting {
  int bits;
  int spike_reserve;  // -1 auto
  bool log_scales;
  bool stochastic;
  DType dtype;
};

CollectiveConfig bitsplit_cfg(Topology t, const Setting& s, int64_t block_bytes) {
  CollectiveConfig c;
  c.mode = mode_id("bitsplit");
  c.topology = t;
  c.params.set("bits", double(s.bits));
  set_spike_reserve(c.params, s.spike_reserve);
  c.params.set("log_scales", double(s.log_scales));
  c.params.set("rounding", (s.stochastic) ? "stochastic" : "nearest");
  c.block_bytes = block_bytes;
  c.seed = 42;
  return c;
}

struct RunResult {
  std::vector<Bucket> out;
  std::vector<CallStats> stats;
};

RunResult run_world(int n, const CollectiveConfig& cfg, const std::vector<Bucket>& in,
                    ReduceOp op = ReduceOp::kSum, uint64_t seq = 1) {
  RunResult r;
  r.out = in;
  r.stats.resize(size_t(n));
  InprocWorld world(n, std::chrono::seconds(60));
  world.run([&](int rank, Transport& t) {
    CallArgs a;
    a.data = r.out[size_t(rank)].data();
    a.dtype = r.out[size_t(rank)].dtype;
    a.numel = r.out[size_t(rank)].numel();
    a.op = op;
    a.seq = seq;
    r.stats[size_t(rank)] = all_reduce(t, cfg, a);
  });
  return r;
}

std::vector<Bucket> gaussian_inputs(int n, int64_t numel, DType dt, uint32_t seed) {
  std::vector<Bucket> in;
  for (int r = 0; r < n; ++r) in.push_back(make_bucket(dt, gaussian(numel, seed * 1000 + uint32_t(r))));
  return in;
}

// Exact sum (in double) of the inputs as the ranks hold them.
std::vector<float> exact_sum(const std::vector<Bucket>& in) {
  std::vector<double> s(size_t(in[0].numel()), 0.0);
  for (const auto& b : in)
    for (int64_t i = 0; i < b.numel(); ++i) s[size_t(i)] += b.at(i);
  return std::vector<float>(s.begin(), s.end());
}

// Table 4 accounting of the elements [e0, e1) (group aligned at e0).
int64_t accounted_range(int64_t e0, int64_t e1, const BitsplitParams& p, DType dt) {
  return e1 > e0 ? accounted_bytes(e1 - e0, p.bits, p.group, p.spikes, p.log_scales, dt) : 0;
}

class BitsplitAllReduce : public ::testing::TestWithParam<std::tuple<Topology, int>> {};

TEST_P(BitsplitAllReduce, BitIdenticalAndBytesEqualTheAccounting) {
  const auto [topo, n] = GetParam();
  const Setting settings[] = {
      {2, -1, false, true, DType::kF32},   // INT2 + spikes (auto), stochastic
      {3, -1, true, false, DType::kF32},   // INT3 + spikes, log scales, nearest
      {5, 0, false, true, DType::kBF16},   // INT5, bf16 bucket
      {7, 1, false, true, DType::kF16},    // INT7 (three planes) + spikes, fp16 bucket
      {8, 0, true, true, DType::kF32},     // INT8, log scales
  };
  const int64_t numel = 20000 + 13;  // not a multiple of a group or a unit
  int si = 0;
  for (const Setting& s : settings) {
    const CollectiveConfig cfg = bitsplit_cfg(topo, s, 2048);  // several blocks per chunk
    auto in = gaussian_inputs(n, numel, s.dtype, uint32_t(n * 10 + si++));
    const RunResult res = run_world(n, cfg, in);
    const std::string what = std::string(topology_name(topo)) + " n=" + std::to_string(n) +
                             " bits=" + std::to_string(s.bits) + " " + dtype_name(s.dtype);

    // Every rank holds the same bytes.
    const size_t bytes = size_t(numel) * size_t(dtype_size(s.dtype));
    for (int r = 1; r < n; ++r)
      ASSERT_EQ(std::memcmp(res.out[size_t(r)].data(), res.out[0].data(), bytes), 0) << what << " rank " << r;

    // Bytes on the wire: per rank, the table 4 accounting of every block the
    // schedule sends; in total, equal to what was received.
    const BitsplitParams p = resolve_bitsplit_params(s.bits, 0, s.spike_reserve, s.log_scales);
    const BitsplitCodec codec(p);
    const Plan plan = codec.make_plan(s.dtype, numel, topology_chunks(topo, n));
    const BlockTable bt = make_blocks(plan, cfg.block_bytes);
    auto block_bytes = [&](int32_t b) {
      const Block& blk = bt.blocks[size_t(b)];
      return accounted_range(std::min(blk.w0 * plan.unit, numel), std::min(blk.w1 * plan.unit, numel), p,
                             s.dtype);
    };
    auto chunk_bytes = [&](int c) {
      return accounted_range(std::min(plan.chunk_begin[size_t(c)] * plan.unit, numel),
                             std::min(plan.chunk_begin[size_t(c) + 1] * plan.unit, numel), p, s.dtype);
    };
    int64_t chunks_total = 0;
    for (int c = 0; c < plan.num_chunks(); ++c) chunks_total += chunk_bytes(c);
    ASSERT_EQ(chunks_total, accounted_bytes(numel, p.bits, p.group, p.spikes, p.log_scales, s.dtype));
    int64_t sent_total = 0, received_total = 0;
    for (int r = 0; r < n; ++r) {
      const CallStats& cs = res.stats[size_t(r)];
      ASSERT_EQ(cs.path, Path::kCompressed) << what;
      int64_t want = 0;
      for (const Op& op : make_program(topo, r, n, bt).ops)
        if (is_send(op.role)) want += block_bytes(op.block);
      EXPECT_EQ(cs.bytes_sent, want) << what << " rank " << r;
      // Closed forms: twostep sends every other chunk once and its own chunk to
      // n-1 peers; ring sends every chunk but its own (reduce-scatter) and every
      // chunk but its successor's (all-gather).
      if (topo == topology_id("twostep")) {
        EXPECT_EQ(cs.bytes_sent, chunks_total + (n - 2) * chunk_bytes(r)) << what;
      }
      if (topo == kTopologyRing) {
        EXPECT_EQ(cs.bytes_sent, 2 * chunks_total - chunk_bytes(r) - chunk_bytes((r + 1) % n)) << what;
      }
      EXPECT_DOUBLE_EQ(cs.bits_per_coord, 8.0 * double(chunks_total) / double(numel));
      sent_total += cs.bytes_sent;
      received_total += cs.bytes_received;
    }
    EXPECT_EQ(sent_total, received_total) << what;

    // The error against the exact sum, in units of one quantisation's error c
    // (rank 0's input compressed once). Each hop of ring quantises a partial
    // sum of k inputs (error ~ k c), the sink the sum of n, so the vNMSE of the
    // sum of n iid inputs is at most ~ c (1 + 2 + ... + n) / n = c (n+1)/2;
    // twostep and butterfly quantise less. Asserted with 1.5x slack.
    const auto x0 = in[0].values();
    const double c1 = vnmse(x0, decompress_all(codec, s.dtype, numel,
                                               compress_all(codec, in[0], rng_ctx(3, 3, 0, s.stochastic))));
    const double e = vnmse(exact_sum(in), res.out[0].values());
    EXPECT_LT(e, 1.5 * c1 * (n + 1) / 2) << what << " single quantisation " << c1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, BitsplitAllReduce,
    ::testing::Combine(::testing::ValuesIn(schedule_topologies()),
                       ::testing::Values(2, 3, 4, 5)),
    [](const auto& info) {
      return std::string(topology_name(std::get<0>(info.param))) + "_n" +
             std::to_string(std::get<1>(info.param));
    });

TEST(BitsplitAllReduceMean, DividesOnceAndStaysIdentical) {
  const int n = 3;
  const int64_t numel = 9000;
  auto in = gaussian_inputs(n, numel, DType::kF32, 5);
  Setting s{4, -1, false, true, DType::kF32};
  const RunResult sum = run_world(n, bitsplit_cfg(kTopologyRing, s, 4096), in, ReduceOp::kSum, 7);
  const RunResult mean = run_world(n, bitsplit_cfg(kTopologyRing, s, 4096), in, ReduceOp::kMean, 7);
  for (int64_t i = 0; i < numel; ++i) {
    ASSERT_EQ(mean.out[1].at(i), mean.out[0].at(i));
    ASSERT_EQ(mean.out[0].at(i), sum.out[0].at(i) / 3.0f) << i;  // same bytes, divided at the end
  }
}

// vNMSE of the all-reduced sum of n iid N(0,1) buckets (INT4, G = 32,
// stochastic, no spikes). Twostep quantises every input once and the sum once:
// error ~ (n-1) c + n c against a signal ~ n, so its vNMSE stays below 2c.
// Ring requantises the growing partial sum at every hop: error ~ c (1 + 2 +
// ... + n), vNMSE ~ c (n+1)/2. Measured (3 seeds averaged, 32768 elements):
//   n:         2         4         8
//   twostep  1.878e-2  2.209e-2  2.387e-2
//   ring     1.878e-2  3.153e-2  5.766e-2
// Asserted: twostep(8)/twostep(2) < 1.45 (measured 1.27), ring(8)/ring(2) >
// 2.6 (measured 3.07) and ring(8) > 2 twostep(8) (measured 2.42).
TEST(BitsplitErrorGrowth, TwostepStaysFlatRingGrowsWithWorldSize) {
  const int64_t numel = int64_t(1) << 15;
  auto measure = [&](Topology t, int n) {
    double acc = 0;
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      auto in = gaussian_inputs(n, numel, DType::kF32, seed * 97 + uint32_t(n));
      Setting s{4, 0, false, true, DType::kF32};
      const RunResult r = run_world(n, bitsplit_cfg(t, s, 1 << 16), in, ReduceOp::kSum, seed);
      acc += vnmse(exact_sum(in), r.out[0].values());
    }
    return acc / 3;
  };
  double two[3], ring[3];
  const int ns[3] = {2, 4, 8};
  for (int i = 0; i < 3; ++i) {
    two[i] = measure(topology_id("twostep"), ns[i]);
    ring[i] = measure(kTopologyRing, ns[i]);
    std::printf("n=%d twostep %.3e ring %.3e\n", ns[i], two[i], ring[i]);
  }
  EXPECT_LT(two[2] / two[0], 1.45);
  EXPECT_GT(ring[2] / ring[0], 2.6);
  EXPECT_GT(ring[2], 2 * two[2]);
}

TEST(BitsplitScheme, NonFiniteInputTakesTheExactPath) {
  const int n = 3;
  const int64_t numel = 10000;
  auto in = gaussian_inputs(n, numel, DType::kF32, 9);
  in[1].f32[1234] = std::nanf("");
  in[2].f32[77] = INFINITY;
  Setting s{2, -1, false, true, DType::kF32};
  const RunResult r = run_world(n, bitsplit_cfg(topology_id("twostep"), s, 4096), in);
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(r.stats[size_t(rank)].path, Path::kExactNonfinite);
    EXPECT_TRUE(std::isnan(r.out[size_t(rank)].f32[1234]));
    EXPECT_TRUE(std::isinf(r.out[size_t(rank)].f32[77]));
  }
}

TEST(BitsplitScheme, FactoryValidatesAndDescribes) {
  CollectiveConfig c;
  c.mode = mode_id("bitsplit");
  c.params.set("bits", double(3));
  auto s = make_scheme(c);
  EXPECT_FALSE(s->exact());
  EXPECT_EQ(s->stats_count(DType::kF32, 1000), 0);
  EXPECT_EQ(s->codec().name(), "bitsplit");
  std::vector<float> v(100, 1.0f);
  EXPECT_FALSE(s->local_pass(v.data(), DType::kF32, 100, nullptr));
  v[99] = -INFINITY;
  EXPECT_TRUE(s->local_pass(v.data(), DType::kF32, 100, nullptr));
  c.params.set("bits", double(9));
  EXPECT_THROW(make_scheme(c), Error);
  c.params.set("bits", double(4));
  c.params.set("group_size", double(40));
  EXPECT_THROW(make_scheme(c), Error);
  // A bad knob is raised on every rank (before any message is exchanged).
  InprocWorld world(2, std::chrono::seconds(10));
  std::vector<std::string> errors(2);
  world.run([&](int r, Transport& t) {
    std::vector<float> x(5000, 1.0f);
    CallArgs a;
    a.data = x.data();
    a.numel = 5000;
    try {
      all_reduce(t, c, a);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (auto& e : errors) EXPECT_NE(e.find("group_size=40"), std::string::npos) << e;
}

}  // namespace
}  // namespace dynamiq
