// The collective driver with the identity codec over the in-process
// transport: every topology and world size gives the exact elementwise sum on
// every rank, bit-identical across ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/executor.h"
#include "hook/transport/inproc_transport.h"
#include "hook/collective/schedule.h"
#include "kernels/device.h"
#include "kernels/base/float_bits.h"
#include "kernels/identity/identity_codec.h"
#include "params_util.h"

namespace dynamiq {
namespace {

struct Case {
  Topology topo;
  int n;
  int64_t numel;
};

std::string topo_str(Topology t) { return topology_name(t); }

// Integer-valued inputs: every partial sum is exact in float32, so any
// summation order must give exactly the reference.
std::vector<std::vector<float>> integer_inputs(int n, int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(numel)));
  for (auto& v : x)
    for (auto& e : v) e = float(d(g));
  return x;
}

CollectiveConfig exact_cfg(Topology t, int64_t block_bytes) {
  CollectiveConfig c;
  c.mode = mode_id("none");
  c.topology = t;
  c.block_bytes = block_bytes;
  return c;
}

void run_all(int n, const CollectiveConfig& cfg, std::vector<std::vector<float>>& data,
             ReduceOp op = ReduceOp::kSum) {
  InprocWorld world(n, std::chrono::seconds(30));
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = data[size_t(r)].data();
    a.dtype = DType::kF32;
    a.numel = int64_t(data[size_t(r)].size());
    a.op = op;
    all_reduce(t, cfg, a);
  });
}

class ExactSum : public ::testing::TestWithParam<std::tuple<Topology, int>> {};

TEST_P(ExactSum, IntegerInputsSumExactlyOnEveryRank) {
  const auto [topo, n] = GetParam();
  for (int64_t numel : {int64_t(0), int64_t(1), int64_t(7), int64_t(255), int64_t(256),
                        int64_t(257), int64_t(1000), int64_t(n * 256 + 3), int64_t(100003)}) {
    for (int64_t block_bytes : {int64_t(1024), int64_t(1 << 20)}) {
      auto x = integer_inputs(n, numel, uint32_t(numel * 31 + n));
      std::vector<float> ref(size_t(numel), 0.f);
      for (auto& v : x)
        for (int64_t i = 0; i < numel; ++i) ref[size_t(i)] += v[size_t(i)];
      run_all(n, exact_cfg(topo, block_bytes), x);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < numel; ++i)
          ASSERT_EQ(x[size_t(r)][size_t(i)], ref[size_t(i)])
              << topo_str(topo) << " n=" << n << " numel=" << numel << " rank " << r << " i=" << i;
    }
  }
}

TEST_P(ExactSum, RandomInputsBitIdenticalAcrossRanks) {
  const auto [topo, n] = GetParam();
  const int64_t numel = 5000;
  std::mt19937 g(n);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(numel)));
  std::vector<double> ref(size_t(numel), 0.0);
  for (auto& v : x)
    for (int64_t i = 0; i < numel; ++i) {
      v[size_t(i)] = d(g);
      ref[size_t(i)] += v[size_t(i)];
    }
  run_all(n, exact_cfg(topo, 2048), x, ReduceOp::kMean);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < numel; ++i) {
      ASSERT_EQ(f32_bits(x[size_t(r)][size_t(i)]), f32_bits(x[0][size_t(i)])) << "rank " << r;
      // float32 summation of n terms: relative error bound ~ n * 2^-24 of sum |x|.
      ASSERT_NEAR(x[size_t(r)][size_t(i)], ref[size_t(i)] / n, 1e-5 * (1 + std::abs(ref[size_t(i)])));
    }
}

INSTANTIATE_TEST_SUITE_P(
    AllTopologies, ExactSum,
    ::testing::Combine(::testing::ValuesIn(schedule_topologies()),
                       ::testing::Range(1, 10)),
    [](const auto& info) {
      return topo_str(std::get<0>(info.param)) + "_n" + std::to_string(std::get<1>(info.param));
    });

TEST(ExactSum, LargeBucketRingAndButterfly) {
  for (Topology t : {kTopologyRing, topology_id("butterfly")}) {
    const int n = 5;
    const int64_t numel = (1 << 20) + 17;
    auto x = integer_inputs(n, numel, 7);
    std::vector<float> ref(size_t(numel), 0.f);
    for (auto& v : x)
      for (int64_t i = 0; i < numel; ++i) ref[size_t(i)] += v[size_t(i)];
    run_all(n, exact_cfg(t, 64 << 10), x);
    for (int r = 0; r < n; ++r) ASSERT_EQ(x[size_t(r)], ref) << topo_str(t) << " rank " << r;
  }
}

// block_bytes = 0 picks the block size per path: 4 MiB on the exact path
// (fewer messages: Gloo's per-message cost), 1 MiB on the compressed ones.
// Ring with 2 ranks on a 32 MiB fp32 bucket: each 16 MiB chunk is sent once in
// the reduce-scatter and once in the all-gather, in 16 MiB / block messages.
TEST(ExactSum, DefaultBlockBytesPerPath) {
  const int n = 2;
  const int64_t numel = int64_t(8) << 20;
  auto messages = [&](Mode mode, int64_t block_bytes) {
    std::vector<std::vector<float>> x(n, std::vector<float>(size_t(numel), 1.0f));
    std::vector<int64_t> msgs(n, 0);
    InprocWorld world(n, std::chrono::seconds(60));
    world.run([&](int r, Transport& t) {
      CollectiveConfig c;
      c.mode = mode;
      c.topology = kTopologyRing;
      c.block_bytes = block_bytes;
      CallArgs a;
      a.data = x[size_t(r)].data();
      a.numel = numel;
      msgs[size_t(r)] = all_reduce(t, c, a).messages_sent;
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(x[size_t(r)][12345], 2.0f);
    return msgs[0];
  };
  EXPECT_EQ(messages(mode_id("none"), 0), 2 * (16 << 20) / CollectiveConfig::kExactBlockBytes);
  EXPECT_EQ(messages(mode_id("none"), 1 << 20), 2 * 16);  // an explicit size applies to every path
  // dynamiq, all-ones data: every super-group takes the same width, so the
  // message count is the chunk's wire bytes over 1 MiB, rounded up, twice.
  const int64_t m = messages(mode_id("dynamiq"), 0);
  EXPECT_GE(m, 2);
  EXPECT_LE(m, 2 * ((int64_t(16) << 20) * 9 / 32 / CollectiveConfig::kCompressedBlockBytes + 1));
  EXPECT_GT(m, 2 * 1) << "compressed path should pipeline in 1 MiB blocks";
}

TEST(ExactSum, Bf16AndF16SmallIntegerSumsAreExact) {
  // 16-bit buckets: every hop sums in float32 and rounds to the bucket type.
  // Small integers stay exact in both formats, so the result is exact. (How a
  // hop rounds non-integers is checked per element against the portable
  // conversions in IdentityCodec16.*, test_identity_codec.cc.)
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (Topology t : schedule_topologies()) {
      const int n = 4;
      const int64_t numel = 3001;
      std::mt19937 g(3);
      std::uniform_int_distribution<int> d(-20, 20);
      std::vector<std::vector<uint16_t>> x(n, std::vector<uint16_t>(size_t(numel)));
      std::vector<float> ref(size_t(numel), 0.f);
      for (auto& v : x)
        for (int64_t i = 0; i < numel; ++i) {
          float f = float(d(g));
          v[size_t(i)] = dt == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
          ref[size_t(i)] += f;
        }
      InprocWorld world(n);
      world.run([&](int r, Transport& tr) {
        CallArgs a;
        a.data = x[size_t(r)].data();
        a.dtype = dt;
        a.numel = numel;
        all_reduce(tr, exact_cfg(t, 1024), a);
      });
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < numel; ++i) {
          float got = dt == DType::kBF16 ? bf16_to_f32(x[size_t(r)][size_t(i)])
                                         : f16_to_f32(x[size_t(r)][size_t(i)]);
          ASSERT_EQ(got, ref[size_t(i)]);
        }
    }
  }
}

// What one rank of a collective that may fail reported.
struct Outcome {
  std::string error;  // empty: no error
  double secs = 0.0;
};

// One all_reduce on every rank of an in-process world of n ranks, each on
// `numel` ones with the default config, after `setup(rank, cfg, args)` has
// adjusted that rank's config and arguments; each rank's error text and time.
std::vector<Outcome> run_catching(int n, std::chrono::milliseconds timeout, int64_t numel,
                                  const std::function<void(int, CollectiveConfig&, CallArgs&)>& setup) {
  InprocWorld world(n, timeout);
  std::vector<Outcome> out(static_cast<size_t>(n));
  world.run([&](int r, Transport& t) {
    std::vector<float> x(static_cast<size_t>(numel), 1.f);
    CollectiveConfig cfg;
    CallArgs a;
    a.data = x.data();
    a.numel = numel;
    setup(r, cfg, a);
    Outcome& o = out[size_t(r)];
    const auto t0 = std::chrono::steady_clock::now();
    try {
      all_reduce(t, cfg, a);
    } catch (const std::bad_alloc&) {
      o.error = "std::bad_alloc";
    } catch (const Error& e) {
      o.error = e.what();
    }
    o.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  return out;
}

constexpr std::chrono::seconds kHeaderTimeout{5};  // what a rank left waiting would run into

TEST(Header, MismatchedConfigRaisesSameErrorOnEveryRank) {
  const auto out = run_catching(3, kHeaderTimeout, 100, [](int r, CollectiveConfig& c, CallArgs&) {
    c.seed = r == 1 ? 99 : 0;  // rank 1 disagrees
  });
  for (const Outcome& o : out) {
    EXPECT_NE(o.error.find("ranks disagree on config fingerprint"), std::string::npos) << o.error;
    EXPECT_EQ(o.error, out[0].error);
  }
}

// The fast allocator's carried offset u is part of the header: a rank whose
// copy differs (a checkpoint restored on some ranks only) would plan other
// widths, so other message sizes, and decode garbage or wait; instead every
// rank raises the same error naming the allocator state.
TEST(Header, DisagreeingAllocatorStateRaisesOnEveryRank) {
  const int n = 3;
  for (int variant = 0; variant < 2; ++variant) {
    InprocWorld world(n, std::chrono::seconds(10));
    std::vector<std::string> errors(n);
    std::vector<PlanState> after_first(n);
    world.run([&](int r, Transport& t) {
      CollectiveConfig c;
      c.mode = mode_id("dynamiq");
      std::mt19937 g(7 + unsigned(r));
      std::normal_distribution<float> d;
      std::vector<float> x(8192);
      for (auto& e : x) e = d(g);
      PlanState ps;
      CallArgs a;
      a.data = x.data();
      a.numel = int64_t(x.size());
      a.plan_state = &ps;
      all_reduce(t, c, a);  // the same state on every rank afterwards
      after_first[size_t(r)] = ps;
      if (r == 1) {
        if (variant == 0) ps.u += 0.25;  // a different offset
        else ps = PlanState{};           // no state: a restore that missed this rank
      }
      try {
        all_reduce(t, c, a);
      } catch (const Error& e) {
        errors[size_t(r)] = e.what();
      }
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(after_first[size_t(r)].has_u);
      EXPECT_EQ(after_first[size_t(r)].u, after_first[0].u);
      EXPECT_NE(errors[size_t(r)].find("ranks disagree on allocator state"), std::string::npos)
          << "variant " << variant << " rank " << r << ": " << errors[size_t(r)];
      EXPECT_EQ(errors[size_t(r)], errors[0]);
    }
  }
}

TEST(Header, MismatchedNumelNamesTheField) {
  const auto out = run_catching(3, kHeaderTimeout, 102, [](int r, CollectiveConfig&, CallArgs& a) {
    a.numel = 100 + r;
  });
  for (const Outcome& o : out) EXPECT_NE(o.error.find("ranks disagree on numel"), std::string::npos) << o.error;
}

TEST(Header, ReportedInputErrorAbortsEveryRank) {
  const auto out = run_catching(3, kHeaderTimeout, 64, [](int r, CollectiveConfig&, CallArgs& a) {
    if (r == 2) a.local_error = InputError::kDType;
  });
  for (const Outcome& o : out)
    EXPECT_NE(o.error.find("1 rank(s) reported unsupported dtype"), std::string::npos) << o.error;
}

// A null bucket on one rank (C++ API misuse) is reported in the header
// exchange like bad input: its peers raise at once instead of waiting.
TEST(Header, NullDataOnOneRankAbortsEveryRankPromptly) {
  for (int64_t numel : {int64_t(64), int64_t(1) << 40}) {  // 2^40: a bucket that would be sliced
    const auto out = run_catching(3, kHeaderTimeout, 64, [numel](int r, CollectiveConfig&, CallArgs& a) {
      if (r != 1) return;
      a.data = nullptr;
      a.numel = numel;
    });
    for (int r = 0; r < 3; ++r) {
      const Outcome& o = out[size_t(r)];
      EXPECT_LT(o.secs, 2.5) << "rank " << r << ": " << o.error;
      EXPECT_NE(o.error.find(r == 1 ? "null data pointer" : "1 rank(s) reported invalid input"), std::string::npos)
          << o.error;
    }
  }
}

// Python reports sparse tensors as well as non-contiguous ones with kLayout:
// the text peers raise must name both.
TEST(Header, LayoutErrorNamesSparseAndNonContiguous) {
  const auto out = run_catching(2, kHeaderTimeout, 64, [](int r, CollectiveConfig&, CallArgs& a) {
    if (r == 0) a.local_error = InputError::kLayout;
  });
  for (const Outcome& o : out)
    EXPECT_NE(o.error.find("1 rank(s) reported unsupported layout (sparse or non-contiguous)"), std::string::npos)
        << o.error;
}

// A rank whose config make_scheme rejects takes part in the header exchange
// (reporting an invalid config) instead of raising before it: its peers, with
// a valid config, raise the common abort at once instead of waiting in the
// exchange for the transport's timeout, and the offending rank raises
// make_scheme's own message. The world's timeout (5 s) is what a hang would
// run into: the test requires every rank to be done well before it.
TEST(Header, InvalidConfigOnOneRankAbortsEveryRankPromptly) {
  struct Bad {
    const char* what;
    CollectiveConfig cfg;
    const char* needle;  // in the offending rank's message (make_scheme's)
  };
  std::vector<Bad> bads;
  {
    CollectiveConfig c;
    c.mode = mode_id("bitsplit");
    c.params.set("bits", double(4));
    c.params.set("group_size", double(16));
    bads.push_back({"bitsplit group_size 16", c, "group_size=16"});
  }
  {
    CollectiveConfig c;
    c.mode = mode_id("dynamiq");
    c.params.set("eps", std::vector<double>{-1.f, -1.f, -1.f, 5.0f});
    bads.push_back({"dynamiq eps 5", c, "eps=(-1, -1, -1, 5) is invalid"});
  }
  {
    CollectiveConfig c;
    c.mode = mode_id("dynamiq");
    c.params.set("group_size", double(1));
    c.params.set("widths", widths_of((1u << 8) | (1u << 16)));
    bads.push_back({"dynamiq widths {8, 16} with group_size 1", c, "not larger on the wire"});
  }
  const std::string common =
      "dynamiq all-reduce aborted on every rank: 1 rank(s) reported an invalid config";
  for (const Bad& bad : bads)
    for (int n : {2, 3}) {
      const std::string where = std::string(bad.what) + " n=" + std::to_string(n);
      const int offender = n - 1;
      const auto out = run_catching(n, kHeaderTimeout, 8192, [&](int r, CollectiveConfig& c, CallArgs&) {
        if (r == offender) {
          c = bad.cfg;
        } else {
          c.mode = mode_id("dynamiq");
        }
      });
      for (int r = 0; r < n; ++r) {
        const Outcome& o = out[size_t(r)];
        EXPECT_LT(o.secs, 2.5) << where << " rank " << r << ": " << o.error;
        if (r == offender) {
          EXPECT_NE(o.error.find(bad.needle), std::string::npos) << where << ": " << o.error;
          EXPECT_EQ(o.error.find("aborted on every rank"), std::string::npos) << where;
        } else {
          EXPECT_EQ(o.error.rfind(common, 0), 0u) << where << " rank " << r << ": " << o.error;
        }
      }
    }
  // every rank with the same invalid config: each raises the detailed message
  for (const Outcome& o : run_catching(2, kHeaderTimeout, 8192, [&](int, CollectiveConfig& c, CallArgs&) { c = bads[0].cfg; }))
    EXPECT_NE(o.error.find(bads[0].needle), std::string::npos) << o.error;
}

// A rank whose local pass fails (on a GPU: an out-of-memory cudaMalloc or a
// sticky CUDA error in the statistics kernel) still takes part in the header
// exchange: its peers raise the common abort at once instead of waiting in
// the exchange (on NCCL, until the watchdog kills the process), and that rank
// raises its own exception, type kept. The failure is injected through a
// Device whose statistics throw (its dynamiq local pass, registered with the
// codec registry); the other ranks run on the host.
class FailingStatsDevice final : public Device {
 public:
  explicit FailingStatsDevice(bool bad_alloc) : bad_alloc_(bad_alloc) {
    static const bool registered = [] {
      DeviceCodecFactory f;
      f.make_codec = [](const Codec&, const Device&) { return std::unique_ptr<Codec>(); };
      f.local_pass = [](const Codec&, const Device& d, const void*, DType, int64_t, float*) -> bool {
        static_cast<const FailingStatsDevice&>(d).fail();
      };
      register_device_codec("dynamiq", "failing-stats", f);
      return true;
    }();
    (void)registered;
  }
  std::string name() const override { return "failing-stats"; }
  const Memory& memory() const override { return host_memory(); }
  void* stream() const override { return nullptr; }
  bool has_nonfinite(const void*, DType, int64_t) const override { return false; }

 private:
  [[noreturn]] void fail() const {
    if (bad_alloc_) throw std::bad_alloc();
    throw Error("injected: statistics kernel failed");
  }
  bool bad_alloc_;
};

TEST(Header, LocalPassFailureOnOneRankAbortsEveryRankPromptly) {
  const std::string common =
      "dynamiq all-reduce aborted on every rank: 1 rank(s) reported a failure in its local pass";
  for (bool bad_alloc : {false, true})
    for (int n : {2, 3}) {
      const std::string where = std::string(bad_alloc ? "bad_alloc" : "Error") + " n=" + std::to_string(n);
      const int offender = n - 1;
      const FailingStatsDevice failing(bad_alloc);
      const auto out = run_catching(n, kHeaderTimeout, 8192, [&](int r, CollectiveConfig& c, CallArgs& a) {
        c.mode = mode_id("dynamiq");
        if (r == offender) a.device = &failing;
      });
      for (int r = 0; r < n; ++r) {
        const Outcome& o = out[size_t(r)];
        EXPECT_LT(o.secs, 2.5) << where << " rank " << r << ": " << o.error;
        if (r == offender)
          EXPECT_EQ(o.error, bad_alloc ? "std::bad_alloc" : "injected: statistics kernel failed") << where;
        else
          EXPECT_EQ(o.error.rfind(common, 0), 0u) << where << " rank " << r << ": " << o.error;
      }
    }
}

// Message tags must fit in 30 bits. Every rank must reach the same verdict
// for a program: a check only on the tags a rank itself uses stopped the ranks
// with the largest tags and left the others waiting for them. Ring of 512
// ranks: 2 * 511 * 512 * B tags, within 2^30 for B = 2052, not for B = 2053.
// Only the last block of each chunk is non-empty, to keep the programs small.
TEST(Schedule, TagSpaceVerdictIsTheSameOnEveryRank) {
  auto table = [](int C, int B) {
    BlockTable bt;
    bt.blocks_per_chunk = B;
    bt.blocks.resize(size_t(C) * size_t(B));
    for (int c = 0; c < C; ++c) bt.blocks[size_t(c) * size_t(B) + size_t(B - 1)] = Block{c, c + 1};
    return bt;
  };
  const int n = 512;
  const BlockTable fits = table(n, 2052), too_many = table(n, 2053);
  for (int r : {0, 1, 255, 509, 510, 511}) {
    EXPECT_NO_THROW(make_program(kTopologyRing, r, n, fits)) << "rank " << r;
    try {
      make_program(kTopologyRing, r, n, too_many);
      ADD_FAILURE() << "rank " << r << " built a program whose tags do not fit";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("schedule tag space exhausted"), std::string::npos) << e.what();
    }
  }
}

// After a failure on one rank, receives it had posted may still be written
// by peers that have not seen the failure yet (Gloo writes a posted receive
// whenever its message arrives). The memory behind them must stay allocated:
// here rank 0's first wait in the metadata all-reduce (a 3-rank ring, whose
// receives are posted ahead into the statistics vector) fails, rank 0
// unwinds, and only then rank 2 sends rank 0 the final bytes of its chunk,
// into a receive that points into rank 0's statistics. Rendezvous sends copy
// straight into the posted receive, as Gloo does. Before the statistics were
// parked, that copy wrote freed memory: the test command runs this test under
// AddressSanitizer, which reports it (a plain build cannot see it). Ranks 1
// and 2 then wait for rank 0 until the world's timeout.
class FaultyTransport final : public Transport {
 public:
  FaultyTransport(Transport& inner, bool fail_first_recv_wait, std::function<void()> before_later_sends_to_0)
      : in_(inner), fail_(fail_first_recv_wait), hold_(std::move(before_later_sends_to_0)) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  bool posts_in_order() const override { return in_.posts_in_order(); }
  bool accepts_shorter_messages() const override { return in_.accepts_shorter_messages(); }
  void group_start() override { in_.group_start(); }
  void group_end() override { in_.group_end(); }
  void allreduce_sum_i64(int64_t* data, size_t count) override { in_.allreduce_sum_i64(data, count); }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override {
    auto r = in_.irecv(buf, bytes, src, tag);
    return fail_ ? std::make_unique<Failing>(std::move(r), this) : std::move(r);
  }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override {
    if (hold_ && dst == 0 && sends_to_0_++ > 0) hold_();
    return in_.isend(buf, bytes, dst, tag);
  }

 private:
  struct Failing final : Request {
    Failing(std::unique_ptr<Request> r, FaultyTransport* t) : inner(std::move(r)), owner(t) {}
    void wait() override {
      if (!owner->failed_) {
        owner->failed_ = true;
        throw TransportError("injected: connection reset");
      }
      inner->wait();
    }
    std::unique_ptr<Request> inner;  // the posted receive stays posted
    FaultyTransport* owner;
  };
  Transport& in_;
  bool fail_;
  bool failed_ = false;
  std::function<void()> hold_;
  int sends_to_0_ = 0;
};

TEST(Failure, LateMessagesAfterARanksFailureLandInLiveMemory) {
  InprocWorld world(3, std::chrono::milliseconds(1500));
  world.set_rendezvous_sends(true);
  std::mutex mu;
  std::condition_variable cv;
  bool rank0_unwound = false;
  std::vector<std::string> errors(3);
  world.run([&](int r, Transport& inner) {
    auto hold = [&] {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait_for(lk, std::chrono::seconds(3), [&] { return rank0_unwound; });
    };
    FaultyTransport t(inner, r == 0, r == 2 ? std::function<void()>(hold) : nullptr);
    CollectiveConfig cfg;
    cfg.mode = mode_id("dynamiq");
    cfg.topology = kTopologyRing;
    std::vector<float> x(65536, 1.f + float(r));  // statistics of 3+ units: every chunk non-empty
    CallArgs a;
    a.data = x.data();
    a.numel = int64_t(x.size());
    try {
      all_reduce(t, cfg, a);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
    if (r == 0) {
      std::lock_guard<std::mutex> lk(mu);
      rank0_unwound = true;
      cv.notify_all();
    }
  });
  EXPECT_NE(errors[0].find("injected: connection reset"), std::string::npos) << errors[0];
  EXPECT_FALSE(errors[1].empty());
  EXPECT_FALSE(errors[2].empty());
}

TEST(Schedule, EveryMessageHasAMatchingReceiveOfTheSameBlock) {
  // For every topology and world size: the multiset of (src, dst, tag, block)
  // over all sends equals that over all receives.
  for (Topology t : schedule_topologies()) {
    for (int n = 1; n <= 17; ++n) {
      Plan plan = make_identity_plan(DType::kF32, 50000, topology_chunks(t, n));
      BlockTable bt = make_blocks(plan, 4096);
      std::multiset<std::tuple<int, int, uint32_t, int>> sends, recvs;
      for (int r = 0; r < n; ++r) {
        Program p = make_program(t, r, n, bt);
        for (const Op& op : p.ops) {
          if (is_send(op.role)) sends.insert({r, op.peer, op.tag, op.block});
          if (is_recv(op.role)) recvs.insert({op.peer, r, op.tag, op.block});
        }
      }
      EXPECT_EQ(sends, recvs) << topology_name(t) << " n=" << n;
    }
  }
}

// A receive posted for more bytes than its message has: an error by default
// (exact sizes, as NCCL needs), completed with the message's bytes when the
// world accepts shorter messages (as Gloo does); a longer message is an error
// either way.
TEST(InprocTransport, ShorterMessagesCompleteALargerReceiveOnlyWhenAccepted) {
  for (bool accept : {false, true}) {
    InprocWorld world(2, std::chrono::seconds(10));
    world.set_accepts_shorter_messages(accept);
    std::vector<uint8_t> got(8, 0xEE);
    bool shorter_failed = false, longer_failed = false;
    world.run([&](int r, Transport& tr) {
      EXPECT_EQ(tr.accepts_shorter_messages(), accept);
      const uint8_t msg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
      if (r == 0) {
        tr.isend(msg, 5, 1, 7)->wait();
        tr.isend(msg, 8, 1, 8)->wait();
        return;
      }
      try {
        tr.irecv(got.data(), 8, 0, 7)->wait();
      } catch (const TransportError&) {
        shorter_failed = true;
      }
      try {
        tr.irecv(got.data(), 4, 0, 8)->wait();
      } catch (const TransportError&) {
        longer_failed = true;
      }
    });
    EXPECT_EQ(shorter_failed, !accept);
    EXPECT_TRUE(longer_failed);
    if (accept) {
      EXPECT_EQ(got, (std::vector<uint8_t>{1, 2, 3, 4, 5, 0xEE, 0xEE, 0xEE}));
    }
    EXPECT_EQ(world.messages_posted(), 2);
  }
}

// The executor's buffer pool keeps what recent collectives needed, not the most
// any collective ever needed: after DDP's first step (the whole model as one
// bucket) the pool shrinks back once the window of later, smaller calls has
// passed, and same-sized calls do not make it grow.
TEST(BufferPool, KeepsRecentWorkingSetNotTheLargestEver) {
  const int n = 2;
  CollectiveConfig cfg = exact_cfg(kTopologyRing, 1 << 20);
  const int64_t big = 8 << 20, small = 64 << 10;  // 32 MB and 256 KB of float32
  std::vector<std::vector<size_t>> seen(n);
  InprocWorld world(n, std::chrono::seconds(60));
  world.run([&](int r, Transport& t) {
    auto run = [&](int64_t numel) {
      std::vector<float> x(size_t(numel), float(r + 1));
      CallArgs a;
      a.data = x.data();
      a.dtype = DType::kF32;
      a.numel = numel;
      all_reduce(t, cfg, a);
      EXPECT_EQ(x[size_t(numel - 1)], float(n * (n + 1) / 2));
      seen[size_t(r)].push_back(executor_pool_bytes());
    };
    run(big);
    run(big);
    for (int k = 0; k < 20; ++k) run(small);
    run(big);
  });
  for (int r = 0; r < n; ++r) {
    const auto& b = seen[size_t(r)];
    ASSERT_EQ(b.size(), 23u);
    // a big call holds at least its receive window (16 MB: it posts that much ahead)
    EXPECT_GE(b[0], size_t(cfg.window_bytes)) << "rank " << r;
    EXPECT_EQ(b[1], b[0]) << "rank " << r << ": a same-sized call grew the pool";
    EXPECT_EQ(b[2], b[0]) << "rank " << r << ": the pool shrank inside the window";
    // 16 small calls later the big working set is gone: a small call holds under 4 MB
    EXPECT_LT(b[21], size_t(4) << 20) << "rank " << r;
    EXPECT_GE(b[22], b[0]) << "rank " << r << ": a big call again keeps its working set";
  }
}

}  // namespace
}  // namespace dynamiq
