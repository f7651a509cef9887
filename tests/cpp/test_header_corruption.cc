// The header exchange's verdict on corrupted sums (found by tests/fuzz/fuzz_collective: a
// summed piece of 2^40 made `s * s` overflow int64, undefined behaviour under UBSan). The
// exchange sums, per 16-bit piece of each field, v and v*v over the ranks and calls the field
// agreed iff n * sum(v^2) == (sum v)^2. Honest sums are bounded (0 <= s <= 65535 n); a
// corrupted contribution (a bit flip in a rank's vector, a broken all-reduce) can put any
// int64 there. With s = 2^32 and q = 0 the wrapped product made the check pass: a corrupted
// header read as agreement. Out-of-range sums must be a disagreement, on every rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/topology.h"
#include "hook/transport/inproc_transport.h"
#include "mode_cases.h"

namespace dynamiq {
namespace {

// Passes everything through, then overwrites two entries of every all-reduce's result (the
// same on every rank, as a corrupted all-reduce would deliver them).
class CorruptSums final : public Transport {
 public:
  CorruptSums(Transport& t, size_t at, int64_t s, int64_t q) : t_(t), at_(at), s_(s), q_(q) {}
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  std::unique_ptr<Request> irecv(void* b, size_t n, int src, uint32_t tag) override { return t_.irecv(b, n, src, tag); }
  std::unique_ptr<Request> isend(const void* b, size_t n, int dst, uint32_t tag) override {
    return t_.isend(b, n, dst, tag);
  }
  void allreduce_sum_i64(int64_t* d, size_t n) override {
    t_.allreduce_sum_i64(d, n);
    if (at_ + 1 < n) d[at_] = s_, d[at_ + 1] = q_;
  }

 private:
  Transport& t_;
  size_t at_;
  int64_t s_, q_;
};

// `cfg`: the config every rank passes (every registered mode and schedule below).
std::vector<std::string> run(size_t at, int64_t s, int64_t q, const CollectiveConfig& cfg) {
  const int n = 3;
  InprocWorld world(n, std::chrono::seconds(10));
  std::vector<std::string> errors(n);
  world.run([&](int r, Transport& t) {
    CorruptSums c(t, at, s, q);
    std::vector<float> x(1000, 1.0f);
    CallArgs a;
    a.data = x.data();
    a.numel = int64_t(x.size());
    try {
      all_reduce(c, cfg, a);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  return errors;
}

// Layout (header_exchange.cc): [count, nonfinite, kNumInputErrors input-error counts], then
// per field (mode first) and per 16-bit piece the pair (sum v, sum v^2).
constexpr size_t kModePiece0 = 2 + kNumInputErrors;

TEST(HeaderCorruption, OverflowingSumsAreADisagreementOnEveryRank) {
  for (const ModeCase& m : mode_cases())  // every registered mode
  for (const auto& [s, q] : std::vector<std::pair<int64_t, int64_t>>{
           {int64_t(1) << 32, 0},            // s*s wraps to 0 == n*q: read as agreement before
           {int64_t(1) << 40, int64_t(1) << 40},  // s*s overflows
           {-3, 3},                          // negative sum
           {0, int64_t(1) << 62},            // n*q overflows
           {INT64_MIN, 0}}) {
    SCOPED_TRACE(m.name + " s " + std::to_string(s) + " q " + std::to_string(q));
    const auto errors = run(kModePiece0, s, q, with_mode(CollectiveConfig{}, m));
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("ranks disagree on mode"), std::string::npos) << e;
      EXPECT_EQ(e, errors[0]);
    }
  }
}

// The first entry counts the ranks that contributed (each adds 1). A count other than the
// world size (a contribution lost or corrupted in the all-reduce) is named as such on every
// rank, before any field is compared.
TEST(HeaderCorruption, WrongRankCountIsReportedOnEveryRank) {
  for (const ModeCase& m : mode_cases())
  for (int64_t count : {int64_t(2), int64_t(4), int64_t(1) << 40}) {
    SCOPED_TRACE(m.name);
    const auto errors = run(0, count, 0, with_mode(CollectiveConfig{}, m));  // entries 0 (count), 1 (non-finite)
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("header exchange counted " + std::to_string(count) + " ranks, expected 3"), std::string::npos)
          << e;
      EXPECT_EQ(e, errors[0]);
    }
  }
}

// Every registered mode on every registered schedule: mode id v (< 2^16: all in its first
// 16-bit piece) on 3 ranks sums to the honest pair (3 v, 3 v^2); written over the real sums,
// the collective still runs.
TEST(HeaderCorruption, HonestSumsStillAgree) {
  for (const ModeCase& m : mode_cases())
    for (Topology t : schedule_topologies()) {
      SCOPED_TRACE(m.name + " " + topology_name(t));
      CollectiveConfig c = with_mode(CollectiveConfig{}, m);
      c.topology = t;
      const int64_t v = int64_t(m.id);
      const auto errors = run(kModePiece0, 3 * v, 3 * v * v, c);
      for (const std::string& e : errors) EXPECT_EQ(e, "");
    }
}

}  // namespace
}  // namespace dynamiq
