// DynamiQ width allocation (csrc/alloc/dynamiq_alloc.h): budget, threshold
// ratios, exact-vs-fast agreement, determinism, fast-solver convergence.
// Oracles here are written independently of the solver: the per-bit-benefit
// formula as the paper states it, the paper's closed form for W = {2,4,8}
// with std::log2, and a brute-force sweep over all threshold events.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <random>
#include <vector>

#include "alloc/dynamiq_alloc.h"
#include "alloc/dynamiq_layout.h"

namespace dynamiq {
namespace {

constexpr uint32_t M(int a) { return 1u << a; }
constexpr uint32_t kMaskDefault = M(2) | M(4) | M(8);
constexpr uint32_t kMaskAll = M(1) | M(2) | M(4) | M(8) | M(16);

const uint32_t kMasks[] = {kMaskDefault, kMaskAll, M(2) | M(8), M(1) | M(2) | M(4) | M(8), M(4) | M(16),
                           M(2) | M(4), M(1) | M(16), M(4), M(2) | M(4) | M(8) | M(16)};

std::vector<int> widths_of(uint32_t mask) {
  std::vector<int> w;
  for (int x : {1, 2, 4, 8, 16})
    if (mask & (1u << x)) w.push_back(x);
  return w;
}

// The allocator's reading of a statistic, restated: NaN -> largest, inf -> FLT_MAX, <= 0 -> 0.
double test_sanitize(float f) {
  if (std::isnan(f)) return double(std::numeric_limits<float>::max());
  if (!(f > 0)) return 0.0;
  return std::min(double(f), double(std::numeric_limits<float>::max()));
}

// Heavy-tailed super-group statistics: log-normal (sigma in log space) with a
// fraction of exact zeros (frozen parameters) as in the paper's Figure 1.
std::vector<float> lognormal_stats(int64_t n, double sigma, double zero_frac, uint32_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> nd(0.0, sigma);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  std::vector<float> f(static_cast<size_t>(n));
  for (auto& x : f) x = ud(g) < zero_frac ? 0.0f : float(std::exp(nd(g)));
  return f;
}

struct AllocRun {
  AllocResult res;
  std::vector<uint8_t> w;
};

AllocRun run(const std::vector<float>& f, int64_t numel, double bits, uint32_t mask, AllocSolver solver,
        AllocState* st = nullptr, DynamiqFormat fmt = {}) {
  AllocParams p;
  p.bits = bits;
  p.widths_mask = mask;
  p.format = fmt;
  p.solver = solver;
  AllocState local;
  AllocRun r;
  r.w.assign(size_t(dynamiq_num_sg(numel, fmt)), 0);
  r.res = dynamiq_allocate(f.data(), numel, p, st ? *st : local, r.w.data());
  return r;
}

// Checks every property a result must have whatever the stats: allowed widths,
// byte accounting from the format (not from the solver), the budget.
void check_budget(const AllocRun& r, int64_t numel, double bits, uint32_t mask, const DynamiqFormat& fmt = {}) {
  int64_t bytes = 0;
  int64_t counts[5] = {0, 0, 0, 0, 0};
  for (uint8_t w : r.w) {
    ASSERT_TRUE(mask & (1u << w)) << "width " << int(w) << " not allowed";
    bytes += dynamiq_sg_bytes(w, fmt);
    ++counts[dynamiq_width_index(w)];
  }
  EXPECT_EQ(bytes, r.res.wire_bytes);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(counts[i], r.res.width_count[i]);
  EXPECT_LE(double(8 * bytes), bits * double(numel)) << "budget exceeded";
  if (numel > 0) {
    EXPECT_DOUBLE_EQ(r.res.bits_per_coord, 8.0 * double(bytes) / double(numel));
  }
}

// Larger F never gets fewer bits. Equal F may get two widths (ties at the
// margin are promoted in SG order while the budget allows): then the wider
// ones come first in SG order, and F = 0 SGs all share one width.
void check_monotone(const std::vector<float>& f, const std::vector<uint8_t>& w) {
  std::vector<size_t> idx(f.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  // by F, then by SG index (stable)
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return test_sanitize(f[a]) < test_sanitize(f[b]); });
  for (size_t i = 1; i < idx.size(); ++i) {
    const double fi = test_sanitize(f[idx[i]]), fp = test_sanitize(f[idx[i - 1]]);
    if (fi > fp)
      ASSERT_GE(w[idx[i]], w[idx[i - 1]]) << "F=" << f[idx[i]] << " got fewer bits than F=" << f[idx[i - 1]];
    else if (fi == 0)
      ASSERT_EQ(w[idx[i]], w[idx[i - 1]]) << "SGs with F = 0, different widths";
    else
      ASSERT_LE(w[idx[i]], w[idx[i - 1]]) << "equal F=" << f[idx[i]] << ": SG " << idx[i]
                                          << " is wider than the earlier SG " << idx[i - 1];
  }
}

// Every width follows from the reported thresholds: the widest b with F >= T(a,b).
void check_consistent_with_thresholds(const std::vector<float>& f, const AllocRun& r, uint32_t mask) {
  const std::vector<int> ws = widths_of(mask);
  ASSERT_EQ(r.res.num_thresholds, int(ws.size()) - 1);
  for (int p = 0; p < r.res.num_thresholds; ++p) {
    EXPECT_EQ(r.res.width_lo[p], ws[size_t(p)]);
    EXPECT_EQ(r.res.width_hi[p], ws[size_t(p) + 1]);
    if (p > 0) {
      EXPECT_LE(r.res.threshold[p - 1], r.res.threshold[p]);
    }
  }
  for (size_t j = 0; j < f.size(); ++j) {
    int w = ws[0];
    for (int p = 0; p < r.res.num_thresholds; ++p)
      if (test_sanitize(f[j]) >= r.res.threshold[p]) w = ws[size_t(p) + 1];
    ASSERT_EQ(int(r.w[j]), w) << "SG " << j << " F=" << f[j];
  }
}

// The paper's per-bit benefit of lowering T(a,b): T (4^(b-a) - 1) / (4^b (b-a)).
double per_bit_benefit(double t, int a, int b) {
  return t * (std::pow(4.0, b - a) - 1.0) / (std::pow(4.0, b) * (b - a));
}

// ---- thresholds --------------------------------------------------------------

TEST(AllocThresholds, FactorsGiveThePaperRatios) {
  // Section 3.2: T(1,2) = 5/32 T(2,4), T(2,4) = 17/512 T(4,8), T(4,8) = 257/2^17 T(8,16).
  EXPECT_NEAR(dynamiq_threshold_factor(1, 2) / dynamiq_threshold_factor(2, 4), 5.0 / 32, 1e-15);
  EXPECT_NEAR(dynamiq_threshold_factor(2, 4) / dynamiq_threshold_factor(4, 8), 17.0 / 512, 1e-16);
  EXPECT_NEAR(dynamiq_threshold_factor(4, 8) / dynamiq_threshold_factor(8, 16), 257.0 / 131072, 1e-17);
  // General pairs: equal per-bit benefit at every threshold, e.g. {2, 8}:
  // K(2,8) = 4^8 * 6 / (4^6 - 1) against K(8,16) = 4^16 * 8 / (4^8 - 1).
  EXPECT_NEAR(dynamiq_threshold_factor(2, 8), 65536.0 * 6 / 4095, 1e-9);
  for (int a : {1, 2, 4, 8})
    for (int b : {2, 4, 8, 16})
      if (a < b) {
        EXPECT_NEAR(per_bit_benefit(dynamiq_threshold_factor(a, b), a, b), 1.0, 1e-14) << a << "," << b;
      }
}

TEST(AllocThresholds, ExactSolverReportsRatiosAndWidthsFollowThem) {
  for (uint32_t mask : kMasks) {
    const std::vector<int> ws = widths_of(mask);
    for (double bits : {3.0, 5.0, 7.0, 10.0}) {
      const int64_t numel = 20000 * 256 - 77;
      const auto f = lognormal_stats(dynamiq_num_sg(numel, {}), 3.0, 0.2, 11);
      if (bits < dynamiq_min_feasible_bits(numel, mask, {})) continue;
      const AllocRun r = run(f, numel, bits, mask, AllocSolver::kExact);
      check_budget(r, numel, bits, mask);
      check_consistent_with_thresholds(f, r, mask);
      // Equal per-bit benefit at every threshold (the paper's condition).
      if (r.res.scale > 0 && std::isfinite(r.res.threshold[r.res.num_thresholds - 1]))
        for (int p = 0; p + 1 < r.res.num_thresholds; ++p) {
          const double b0 = per_bit_benefit(r.res.threshold[p], ws[size_t(p)], ws[size_t(p) + 1]);
          const double b1 = per_bit_benefit(r.res.threshold[p + 1], ws[size_t(p) + 1], ws[size_t(p) + 2]);
          EXPECT_NEAR(b0 / b1, 1.0, 1e-12) << "mask " << mask << " bits " << bits;
        }
      if (mask == kMaskDefault && r.res.scale > 0) {
        EXPECT_NEAR(r.res.threshold[0] / r.res.threshold[1], 17.0 / 512, 1e-14);
      }
      if (mask == kMaskAll && r.res.scale > 0 && std::isfinite(r.res.threshold[3])) {
        EXPECT_NEAR(r.res.threshold[0] / r.res.threshold[1], 5.0 / 32, 1e-14);
        EXPECT_NEAR(r.res.threshold[1] / r.res.threshold[2], 17.0 / 512, 1e-14);
        EXPECT_NEAR(r.res.threshold[2] / r.res.threshold[3], 257.0 / 131072, 1e-14);
      }
    }
  }
}

// Brute force over the family: every (SG, threshold) event F_j / K_p, swept
// from the largest down (each lowers C past one more upgrade), ties together.
// The exact solver must land on the last prefix that fits.
TEST(AllocThresholds, ExactSolverIsTheTightestRuleOfTheFamily) {
  for (uint32_t mask : {kMaskDefault, kMaskAll, M(2) | M(8), M(1) | M(2) | M(4)}) {
    const std::vector<int> ws = widths_of(mask);
    for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u}) {
      // Log-normal; with zeros; clustered in a few 1/16-octave bins (uniform
      // in [1, 2)); many ties; a huge range up to FLT_MAX with denormals;
      // ties whose F/K coincide across thresholds (17/K(2,4) == 512/K(4,8)).
      std::vector<float> f = lognormal_stats(3000, 2.5, seed == 2 ? 0.3 : 0.0, seed);
      std::mt19937 g(seed);
      if (seed == 3)
        for (auto& x : f) x = 1.0f + std::uniform_real_distribution<float>(0, 1)(g);
      if (seed == 4)
        for (auto& x : f) x = std::array<float, 4>{1.f, 2.f, 3.f, 1000.f}[g() % 4];
      if (seed == 5)
        for (auto& x : f) x = 1.0f + 1e-6f * float(g() % 64);  // all in one bin
      if (seed == 7)
        for (auto& x : f) x = std::array<float, 3>{17.f, 512.f, 1e5f}[g() % 3];
      if (seed == 6) {
        f = lognormal_stats(3000, 40.0, 0.1, seed);
        for (auto& x : f) x = float(test_sanitize(x));  // overflowed exp -> FLT_MAX, as the solver reads it
        f[0] = std::numeric_limits<float>::max();
        f[1] = std::numeric_limits<float>::denorm_min();
      }
      std::vector<double> budgets = {2.7, 3.3, 4.4, 5.0, 6.1, 8.0, 9.9};
      if (seed == 7)  // a fine sweep: some budgets end inside the mixed 17/512 set
        for (int i = 0; i < 120; ++i) budgets.push_back(2.6 + 0.05 * i);
      for (double bits : budgets) {
        const int64_t numel = 3000 * 256;
        if (bits < dynamiq_min_feasible_bits(numel, mask, {})) continue;
        // Each upgrade (SG j across threshold p) enters the rule at the largest
        // scale C with C * K_p <= F_j (the rule's double product): lowering C
        // makes the upgrades in decreasing order of that C, equal ones at once.
        struct Ev {
          double c;
          int p;
          size_t sg;
        };
        std::vector<Ev> ev;
        for (size_t j = 0; j < f.size(); ++j)
          for (size_t p = 0; p + 1 < ws.size(); ++p) {
            const int a = ws[p], b = ws[p + 1];
            const double k = std::pow(4.0, b) * (b - a) / (std::pow(4.0, b - a) - 1.0);
            const double F = test_sanitize(f[j]);
            if (!(F > 0)) continue;
            double c = F / k;
            while (c * k > F) c = std::nextafter(c, 0.0);
            while (std::nextafter(c, 1e308) * k <= F) c = std::nextafter(c, 1e308);
            ev.push_back({c, int(p), j});
          }
        std::sort(ev.begin(), ev.end(), [](const Ev& a, const Ev& b) {
          return a.c != b.c ? a.c > b.c : a.sg != b.sg ? a.sg < b.sg : a.p < b.p;
        });
        auto step_bytes = [&](const Ev& e) {
          return dynamiq_sg_bytes(ws[size_t(e.p) + 1], {}) - dynamiq_sg_bytes(ws[size_t(e.p)], {});
        };
        auto fits = [&](int64_t b) { return double(8 * b) <= bits * double(numel); };
        std::vector<int> wexp(f.size(), ws[0]);
        int64_t bytes = int64_t(f.size()) * dynamiq_sg_bytes(ws[0], {});
        for (size_t i = 0; i < ev.size();) {
          size_t e = i;
          int64_t nb = bytes;
          while (e < ev.size() && ev[e].c == ev[i].c) nb += step_bytes(ev[e++]);
          if (!fits(nb)) {
            // the first set that does not fit whole: its upgrades in SG order,
            // each that still fits (and whose SG is at its lower width)
            for (size_t t = i; t < e; ++t)
              if (wexp[ev[t].sg] == ws[size_t(ev[t].p)] && fits(bytes + step_bytes(ev[t]))) {
                bytes += step_bytes(ev[t]);
                wexp[ev[t].sg] = ws[size_t(ev[t].p) + 1];
              }
            break;
          }
          for (size_t t = i; t < e; ++t) wexp[ev[t].sg] = ws[size_t(ev[t].p) + 1];
          bytes = nb;
          i = e;
        }
        // Everything at the widest width (C = 0) when that fits.
        const int64_t all_max = int64_t(f.size()) * dynamiq_sg_bytes(ws.back(), {});
        if (fits(all_max)) {
          bytes = all_max;
          std::fill(wexp.begin(), wexp.end(), ws.back());
        }
        const AllocRun r = run(f, numel, bits, mask, AllocSolver::kExact);
        EXPECT_EQ(r.res.wire_bytes, bytes) << "mask " << mask << " seed " << seed << " bits " << bits;
        for (size_t j = 0; j < f.size(); ++j)
          ASSERT_EQ(int(r.w[j]), wexp[j]) << "SG " << j << " mask " << mask << " seed " << seed << " bits " << bits;
      }
    }
  }
}

// Appendix A's closed form for W = {2,4,8}:
//   q = 2^clamp([1,3], floor(log2(4 / log2(512/17) * log2 F + u)))
// with u chosen so that z = 4 at T(2,4). Our threshold rule must agree with it
// except for F within 1e-9 (relative) of a threshold, where log rounding decides.
TEST(AllocThresholds, FastRuleIsThePapersClosedForm) {
  const double alpha = 4.0 / std::log2(512.0 / 17.0);
  for (double bits : {3.0, 4.0, 5.0, 6.5}) {
    const int64_t numel = 50000 * 256;
    const auto f = lognormal_stats(50000, 3.0, 0.1, 7);
    const AllocRun r = run(f, numel, bits, kMaskDefault, AllocSolver::kFast);
    check_budget(r, numel, bits, kMaskDefault);
    const double t24 = r.res.threshold[0], t48 = r.res.threshold[1];
    const double u_paper = 4.0 - alpha * std::log2(t24);
    int64_t compared = 0;
    for (size_t j = 0; j < f.size(); ++j) {
      const double x = f[j];
      if (std::fabs(x - t24) <= 1e-9 * t24 || std::fabs(x - t48) <= 1e-9 * t48) continue;
      int q;
      const double z = x > 0 ? alpha * std::log2(x) + u_paper : -INFINITY;
      if (!(z > 0)) q = 2;  // log2 of a non-positive z: the clamp's lower end
      else q = 1 << std::min(3, std::max(1, int(std::floor(std::log2(z)))));
      ASSERT_EQ(int(r.w[j]), q) << "F=" << x << " z=" << z;
      ++compared;
    }
    EXPECT_GT(compared, 49000);
  }
}

// ---- budget under random and adversarial stats ---------------------------------

TEST(AllocBudget, RandomAndAdversarialStats) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float fmax = std::numeric_limits<float>::max();
  std::vector<std::pair<const char*, std::vector<float>>> cases;
  const int64_t n = 4099;
  cases.push_back({"all equal", std::vector<float>(size_t(n), 3.5f)});
  cases.push_back({"zeros", std::vector<float>(size_t(n), 0.0f)});
  {
    auto v = std::vector<float>(size_t(n), 1.0f);
    v[1234] = 1e30f;
    cases.push_back({"one huge", v});
  }
  {
    auto v = lognormal_stats(n, 2.0, 0.0, 5);
    v[17] = fmax;
    v[18] = inf;
    v[19] = inf;
    v[20] = nan;
    v[21] = -1.0f;
    v[22] = -0.0f;
    v[23] = std::numeric_limits<float>::denorm_min();
    cases.push_back({"inf/nan/negative/denormal", v});
  }
  cases.push_back({"all inf", std::vector<float>(size_t(n), inf)});
  cases.push_back({"lognormal sigma 4", lognormal_stats(n, 4.0, 0.0, 6)});
  cases.push_back({"lognormal sigma 8 + zeros", lognormal_stats(n, 8.0, 0.3, 7)});
  {
    std::mt19937 g(8);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(g);
    cases.push_back({"uniform", v});
  }
  {
    std::vector<float> v(static_cast<size_t>(n));  // two clusters far apart
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i % 3 == 0 ? 1e-20f : 1e20f;
    cases.push_back({"bimodal", v});
  }
  for (const auto& [name, f] : cases)
    for (uint32_t mask : kMasks)
      for (int64_t numel : {n * 256, n * 256 - 255})
        for (double bits : {1.6, 2.6, 3.0, 4.0, 4.6, 5.0, 6.0, 8.0, 8.6, 12.0, 16.0, 40.0})
          for (AllocSolver s : {AllocSolver::kExact, AllocSolver::kFast}) {
            SCOPED_TRACE(std::string(name) + " mask " + std::to_string(mask) + " numel " +
                         std::to_string(numel) + " bits " + std::to_string(bits) +
                         (s == AllocSolver::kExact ? " exact" : " fast"));
            if (bits < dynamiq_min_feasible_bits(numel, mask, {})) {
              EXPECT_THROW(run(f, numel, bits, mask, s), Error);
              continue;
            }
            const AllocRun r = run(f, numel, bits, mask, s);
            check_budget(r, numel, bits, mask);
            check_monotone(f, r.w);
          }
}

TEST(AllocBudget, EdgeCasesHaveTheExpectedWidths) {
  const int64_t n = 1000, numel = n * 256;
  // All equal: the widest width that fits for every SG, then as many SGs as
  // fit one width wider, the first ones in SG order (ties are split).
  // Bytes per SG (S=256, s=16, hierarchical): 2: 82, 4: 146, 8: 274 -> 2.5625, 4.5625, 8.5625 bits.
  const int64_t b2 = dynamiq_sg_bytes(2, {}), b4 = dynamiq_sg_bytes(4, {}), b8 = dynamiq_sg_bytes(8, {});
  ASSERT_EQ(b2, 82);
  ASSERT_EQ(b4, 146);
  ASSERT_EQ(b8, 274);
  auto budget_bytes = [&](double bits) { return int64_t(bits * double(numel) / 8); };
  for (AllocSolver s : {AllocSolver::kExact, AllocSolver::kFast}) {
    const std::vector<float> eq(size_t(n), 7.0f);
    {
      const AllocRun r = run(eq, numel, 4.5, kMaskDefault, s);
      const int64_t up = (budget_bytes(4.5) - n * b2) / (b4 - b2);  // 968
      EXPECT_EQ(r.res.width_count[2], up);
      EXPECT_EQ(r.res.width_count[1], n - up);
      EXPECT_EQ(r.res.tie_promoted, up);
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(r.w[size_t(j)], j < up ? 4 : 2) << "SG " << j;
    }
    EXPECT_EQ(run(eq, numel, 4.5625, kMaskDefault, s).res.width_count[2], n);
    {
      const AllocRun r = run(eq, numel, 8.5, kMaskDefault, s);
      const int64_t up = (budget_bytes(8.5) - n * b4) / (b8 - b4);  // 984
      EXPECT_EQ(r.res.width_count[3], up);
      EXPECT_EQ(r.res.width_count[2], n - up);
    }
    // Budget above the widest width: everything at the widest width.
    EXPECT_EQ(run(eq, numel, 8.5625, kMaskDefault, s).res.width_count[3], n);
    const std::vector<float> zeros(size_t(n), 0.0f);
    EXPECT_EQ(run(zeros, numel, 9.0, kMaskDefault, s).res.width_count[3], n);
    EXPECT_EQ(run(zeros, numel, 16.0, kMaskAll, s).res.width_count[4], n);
    // Zeros below the widest: nothing is worth more than the narrowest width.
    EXPECT_EQ(run(zeros, numel, 8.0, kMaskDefault, s).res.width_count[1], n);
    // One huge SG among equal ones gets the widest width.
    std::vector<float> one(size_t(n), 1.0f);
    one[500] = 1e30f;
    const AllocRun r = run(one, numel, 2.6, kMaskDefault, s);
    EXPECT_EQ(r.w[500], 8);
    // and what is left goes to the first of the tied ones, one width up
    const int64_t up = (budget_bytes(2.6) - (n - 1) * b2 - b8) / (b4 - b2);  // 15
    EXPECT_EQ(r.res.width_count[2], up);
    EXPECT_EQ(r.res.width_count[1], n - 1 - up);
    EXPECT_EQ(r.w[size_t(up) - 1], 4);
    EXPECT_EQ(r.w[size_t(up)], 2);
    // Overflowed statistic (inf) and NaN: treated as the largest.
    one[500] = std::numeric_limits<float>::infinity();
    one[501] = std::numeric_limits<float>::quiet_NaN();
    const AllocRun r2 = run(one, numel, 2.8, kMaskDefault, s);
    EXPECT_EQ(r2.w[500], 8);
    EXPECT_EQ(r2.w[501], 8);
    // num_sg = 1.
    EXPECT_EQ(run({5.0f}, 256, 5.0, kMaskDefault, s).w[0], 4);
    EXPECT_EQ(run({5.0f}, 256, 9.0, kMaskDefault, s).w[0], 8);
    // numel = 0: nothing to allocate, no error.
    EXPECT_EQ(run({}, 0, 5.0, kMaskDefault, s).res.num_sg, 0);
  }
}

// A bucket made of one pattern repeated (16 distinct statistics, 64 copies
// each, some zero): a threshold rule moves the 64 copies of a statistic
// together, so without splitting ties the budget is badly underused. Both
// solvers, cold and warm, must give the same widths, use the budget to within
// one upgrade, and upgrade the copies of a statistic in SG order.
TEST(AllocTies, RepeatedPatternUsesTheBudgetAndBothSolversAgree) {
  std::vector<float> pat = lognormal_stats(16, 2.0, 0.0, 41);
  pat[3] = 0.0f;
  const int64_t n = 16 * 64, numel = n * 256;
  std::vector<float> f;
  for (int c = 0; c < 64; ++c) f.insert(f.end(), pat.begin(), pat.end());
  for (uint32_t mask : {kMaskDefault, kMaskAll, M(2) | M(8)})
    for (double bits : {2.7, 3.5, 4.5, 5.0, 6.3, 8.0}) {
      if (bits < dynamiq_min_feasible_bits(numel, mask, {})) continue;
      SCOPED_TRACE("mask " + std::to_string(mask) + " bits " + std::to_string(bits));
      const AllocRun ex = run(f, numel, bits, mask, AllocSolver::kExact);
      check_budget(ex, numel, bits, mask);
      check_monotone(f, ex.w);
      const std::vector<int> ws = widths_of(mask);
      int64_t step = 0;
      for (size_t i = 0; i + 1 < ws.size(); ++i)
        step = std::max(step, dynamiq_sg_bytes(ws[i + 1], {}) - dynamiq_sg_bytes(ws[i], {}));
      const int64_t budget = int64_t(bits * double(numel) / 8);
      const int64_t all_max = n * dynamiq_sg_bytes(ws.back(), {});
      // within one (largest) upgrade of the budget, unless every nonzero SG is at the widest width
      int64_t nonzero_narrow = 0;
      for (size_t j = 0; j < f.size(); ++j) nonzero_narrow += f[j] > 0 && ex.w[j] < ws.back();
      if (all_max > budget && nonzero_narrow > 0) {
        EXPECT_GT(ex.res.wire_bytes, budget - step);
      }
      AllocState st;
      for (int k = 0; k < 3; ++k) {
        const AllocRun fa = run(f, numel, bits, mask, AllocSolver::kFast, &st);
        ASSERT_EQ(fa.w, ex.w) << "fast step " << k;
      }
    }
}

// Two statistics whose F/K are equal in real numbers (17 m at 2->4, 512 m at
// 4->8: K(4,8) / K(2,4) = 512 / 17) but which the rule's double products
// C * K upgrade at different C. The fill must follow the rule's order, not
// F/K's: the fast solver (warm, from a different bracket) must then end at
// the exact solver's widths, never above them (a review found 500 SGs above).
TEST(AllocTies, CrossThresholdTiesFollowTheRulesOwnOrder) {
  const float m = 998.68359375f;
  const int64_t nA = 1000, nB = 1000, n = nA + nB, numel = n * 256;
  std::vector<float> f;
  for (int64_t i = 0; i < nB; ++i) f.push_back(512.0f * m);
  for (int64_t i = 0; i < nA; ++i) f.push_back(17.0f * m);
  const int64_t b4 = dynamiq_sg_bytes(4, {}), b8 = dynamiq_sg_bytes(8, {});
  for (int64_t extra : {0, 1, 300, 999}) {
    const int64_t budget = nA * b4 + nB * b4 + extra * (b8 - b4);
    const double bits = 8.0 * double(budget) / double(numel);
    SCOPED_TRACE("extra " + std::to_string(extra));
    const AllocRun ex = run(f, numel, bits, kMaskDefault, AllocSolver::kExact);
    check_budget(ex, numel, bits, kMaskDefault);
    check_monotone(f, ex.w);
    AllocState st;
    for (int k = 0; k < 4; ++k) {
      const AllocRun fa = run(f, numel, bits, kMaskDefault, AllocSolver::kFast, &st);
      for (size_t j = 0; j < f.size(); ++j) ASSERT_LE(fa.w[j], ex.w[j]) << "SG " << j << " step " << k;
      if (k > 0) {
        ASSERT_EQ(fa.w, ex.w) << "step " << k;
      }
    }
  }
}

TEST(AllocBudget, BelowMinimumNamesTheMinimum) {
  const std::vector<float> f(10, 1.0f);
  for (AllocSolver s : {AllocSolver::kExact, AllocSolver::kFast}) {
    // 10 full SGs at 2 bits: 82 bytes each = 2.5625 bits per coordinate.
    try {
      run(f, 2560, 2.5, kMaskDefault, s);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("2.5625"), std::string::npos) << e.what();
    }
    // A partial SG is padded on the wire: 2 SGs for 300 elements at 2 bits = 164 bytes = 4.37333 bits.
    try {
      run({1.0f, 1.0f}, 300, 4.3, kMaskDefault, s);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("4.37333"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(run({1.0f, 1.0f}, 300, 164.0 * 8 / 300, kMaskDefault, s));
  }
  EXPECT_DOUBLE_EQ(dynamiq_min_feasible_bits(2560, kMaskAll, {}), 50.0 * 8 / 256);
}

// dynamiq_budget_feasible is the driver's test for routing a bucket to the
// exact path before planning (Scheme::fits_budget): it must hold exactly when
// dynamiq_allocate accepts the budget, also at the boundary (a budget equal to
// the minimum, one ulp below it) and for partial last super-groups.
TEST(AllocBudget, FeasibleExactlyWhenAllocateAccepts) {
  for (uint32_t mask : {kMaskDefault, kMaskAll, M(4) | M(16)})
    for (int64_t numel : {int64_t(1), int64_t(255), int64_t(256), int64_t(257), int64_t(300), int64_t(4096),
                          int64_t(4097), int64_t(4096 * 5 + 1), int64_t(12345)}) {
      const std::vector<float> f(size_t(dynamiq_num_sg(numel, {})), 1.0f);
      const double lo = dynamiq_min_feasible_bits(numel, mask, {});
      for (double bits : {lo, std::nextafter(lo, 0.0), std::nextafter(lo, 100.0), 2.6, 5.0, lo * 0.99, lo * 1.01}) {
        const bool feasible = dynamiq_budget_feasible(numel, bits, mask, {});
        for (AllocSolver s : {AllocSolver::kExact, AllocSolver::kFast}) {
          bool accepted = true;
          try {
            run(f, numel, bits, mask, s);
          } catch (const Error& e) {
            accepted = false;
            EXPECT_NE(std::string(e.what()).find("below the minimum feasible"), std::string::npos) << e.what();
          }
          EXPECT_EQ(accepted, feasible) << "numel=" << numel << " bits=" << bits << " mask=" << mask;
        }
      }
    }
  // the cases of a partial last SG the driver sends exactly
  EXPECT_FALSE(dynamiq_budget_feasible(257, 5.0, kMaskDefault, {}));
  EXPECT_FALSE(dynamiq_budget_feasible(4097, 2.6, kMaskDefault, {}));
  EXPECT_TRUE(dynamiq_budget_feasible(4096, 2.6, kMaskDefault, {}));
  EXPECT_TRUE(dynamiq_budget_feasible(0, 1.0, kMaskDefault, {}));
  EXPECT_THROW(dynamiq_budget_feasible(256, 5.0, M(3), {}), Error);
}

TEST(AllocBudget, BadParametersThrow) {
  const std::vector<float> f(4, 1.0f);
  for (double bits : {0.0, -1.0, double(NAN), double(INFINITY)}) EXPECT_THROW(run(f, 1024, bits, kMaskDefault, AllocSolver::kFast), Error);
  EXPECT_THROW(run(f, 1024, 5.0, 0u, AllocSolver::kFast), Error);
  EXPECT_THROW(run(f, 1024, 5.0, M(3) | M(4), AllocSolver::kFast), Error);
  EXPECT_THROW(run(f, 1024, 5.0, 1u << 31, AllocSolver::kExact), Error);
  DynamiqFormat bad;
  bad.s = 24;  // 256 % 24 != 0
  EXPECT_THROW(run(f, 1024, 5.0, kMaskDefault, AllocSolver::kExact, nullptr, bad), Error);
  AllocParams p;
  AllocState st;
  EXPECT_THROW(dynamiq_allocate(nullptr, 1024, p, st, nullptr), Error);
}

TEST(AllocBudget, FlatScalesFormat) {
  DynamiqFormat flat;
  flat.hierarchical = false;  // 2 bytes per group of 16: 2 bits of metadata per coordinate
  const auto f = lognormal_stats(5000, 3.0, 0.1, 9);
  for (AllocSolver s : {AllocSolver::kExact, AllocSolver::kFast})
    for (double bits : {3.0, 5.0, 7.0}) {
      const AllocRun r = run(f, 5000 * 256, bits, kMaskAll, s, nullptr, flat);
      check_budget(r, 5000 * 256, bits, kMaskAll, flat);
    }
  EXPECT_THROW(run(f, 5000 * 256, 2.9, kMaskDefault, AllocSolver::kExact, nullptr, flat), Error);  // min 4 bits
}

// ---- exact vs fast ---------------------------------------------------------------

// Same family, fast never below the exact scale: fast widths <= exact widths SG
// by SG, and bits used within 0.01 bits per coordinate (stated tolerance) after
// a cold first step and after warm steps.
TEST(AllocAgreement, FastWithinToleranceOfExact) {
  for (uint32_t mask : {kMaskDefault, kMaskAll, M(2) | M(8), M(1) | M(2) | M(4) | M(8)})
    for (double sigma : {1.0, 3.0, 6.0})
      for (double bits : {3.0, 4.0, 5.0, 6.0, 8.0}) {
        const int64_t num_sg = 30000, numel = num_sg * 256;
        if (bits < dynamiq_min_feasible_bits(numel, mask, {})) continue;
        SCOPED_TRACE("mask " + std::to_string(mask) + " sigma " + std::to_string(sigma) + " bits " +
                     std::to_string(bits));
        const auto f = lognormal_stats(num_sg, sigma, 0.15, 21);
        const AllocRun ex = run(f, numel, bits, mask, AllocSolver::kExact);
        AllocState st;
        for (int step = 0; step < 3; ++step) {
          const AllocRun fa = run(f, numel, bits, mask, AllocSolver::kFast, &st);
          EXPECT_LE(fa.res.wire_bytes, ex.res.wire_bytes);
          EXPECT_LE(ex.res.bits_per_coord - fa.res.bits_per_coord, 0.01);
          for (size_t j = 0; j < f.size(); ++j) ASSERT_LE(fa.w[j], ex.w[j]);
          check_monotone(f, fa.w);
        }
      }
}

// ---- determinism -------------------------------------------------------------------

TEST(AllocDeterminism, IdenticalStatsGiveIdenticalWidths) {
  const int64_t num_sg = 12345, numel = num_sg * 256 - 3;
  const auto f = lognormal_stats(num_sg, 3.0, 0.2, 31);
  // A copy at a different alignment (vector loops peel differently) and an
  // interleaved copy read with stride 2.
  std::vector<float> shifted(static_cast<size_t>(num_sg) + 3);
  std::copy(f.begin(), f.end(), shifted.begin() + 3);
  std::vector<float> inter(static_cast<size_t>(num_sg) * 2, -7.0f);
  for (int64_t j = 0; j < num_sg; ++j) inter[size_t(2 * j + 1)] = f[size_t(j)];
  for (AllocSolver s : {AllocSolver::kExact, AllocSolver::kFast}) {
    AllocParams p;
    p.solver = s;
    AllocState s0, s1, s2, s3;
    std::vector<uint8_t> w0(static_cast<size_t>(num_sg)), w1(static_cast<size_t>(num_sg)), w2(static_cast<size_t>(num_sg)), w3(static_cast<size_t>(num_sg));
    for (int step = 0; step < 3; ++step) {
      const AllocResult r0 = dynamiq_allocate(f.data(), numel, p, s0, w0.data());
      const AllocResult r1 = dynamiq_allocate(f.data(), numel, p, s1, w1.data());
      const AllocResult r2 = dynamiq_allocate(shifted.data() + 3, numel, p, s2, w2.data());
      const AllocResult r3 = dynamiq_allocate(inter.data() + 1, numel, p, s3, w3.data(), 2);
      EXPECT_EQ(w0, w1);
      EXPECT_EQ(w0, w2);
      EXPECT_EQ(w0, w3);
      for (const AllocResult* r : {&r1, &r2, &r3}) {
        EXPECT_EQ(r0.wire_bytes, r->wire_bytes);
        EXPECT_EQ(r0.scale, r->scale);
        EXPECT_EQ(r0.passes, r->passes);
      }
      for (const AllocState* st : {&s1, &s2, &s3}) {
        EXPECT_EQ(s0.u, st->u);
        EXPECT_EQ(s0.step, st->step);
      }
    }
  }
}

TEST(AllocDeterminism, ScaleOfUIsMonotoneAndRoundTrips) {
  EXPECT_EQ(dynamiq_scale_of_u(0.0), 1.0);
  EXPECT_EQ(dynamiq_scale_of_u(3.0), 0.125);
  EXPECT_EQ(dynamiq_scale_of_u(-10.0), 1024.0);
  EXPECT_EQ(dynamiq_scale_of_u(1023.0), 0.0);
  EXPECT_EQ(dynamiq_scale_of_u(-1024.0), INFINITY);
  double prev = INFINITY;
  for (double u = -50; u <= 50; u += 0.01) {
    const double c = dynamiq_scale_of_u(u);
    EXPECT_LE(c, prev);
    // Within the piecewise-linear log2's error (< 0.0861) of 2^-u.
    EXPECT_NEAR(std::log2(c), -u, 0.0861);
    prev = c;
  }
  // u on a grid of 2^-12 round-trips exactly through the scale.
  for (int i = -4096 * 40; i <= 4096 * 40; i += 37) {
    const double u = double(i) / 4096;
    EXPECT_EQ(dynamiq_u_of_scale(dynamiq_scale_of_u(u)), u);
  }
}

// ---- fast solver across steps -----------------------------------------------------

// Stationary stream, 3 passes per step, from a cold start (one exact search)
// and from carried offsets far off in both directions: bits used never
// decreases, never exceeds the budget, and reaches the exact solver's within
// 0.01 bits; u settles (the last steps move it by < 2^-16).
TEST(AllocFastSolver, ConvergesOnAStationaryStream) {
  for (double sigma : {1.5, 4.0})
    for (double bits : {3.5, 5.0, 7.0}) {
      const int64_t num_sg = 20000, numel = num_sg * 256;
      const auto f = lognormal_stats(num_sg, sigma, 0.2, 41);
      const AllocRun ex = run(f, numel, bits, kMaskDefault, AllocSolver::kExact);
      for (double u0 : {std::nan(""), 200.0, -200.0, 0.0}) {
        SCOPED_TRACE("sigma " + std::to_string(sigma) + " bits " + std::to_string(bits) + " u0 " + std::to_string(u0));
        AllocParams p;
        p.bits = bits;
        p.solver = AllocSolver::kFast;
        p.max_passes = 3;
        AllocState st;
        if (!std::isnan(u0)) st.has_u = true, st.u = u0;
        std::vector<uint8_t> w(static_cast<size_t>(num_sg));
        double prev_bits = 0, prev_u = NAN;
        std::vector<double> moves;
        for (int step = 0; step < 60; ++step) {
          const AllocResult r = dynamiq_allocate(f.data(), numel, p, st, w.data());
          ASSERT_LE(double(8 * r.wire_bytes), bits * double(numel));
          ASSERT_GE(r.bits_per_coord, prev_bits) << "step " << step;
          if (step > 0 || !std::isnan(u0)) {
            // a cold first step is one exact search, and so is a step whose
            // bracket max_passes cannot find (here: a carried u far off)
            if (r.exact_fallback) {
              ASSERT_LE(ex.res.bits_per_coord - r.bits_per_coord, 0.01) << "step " << step;
            } else {
              ASSERT_LE(r.passes, 3) << "step " << step;
            }
          }
          prev_bits = r.bits_per_coord;
          if (!std::isnan(prev_u)) moves.push_back(std::fabs(st.u - prev_u));
          prev_u = st.u;
        }
        EXPECT_LE(ex.res.bits_per_coord - prev_bits, 0.01);
        for (size_t i = moves.size() - 5; i < moves.size(); ++i) EXPECT_LT(moves[i], 1.0 / 65536);
      }
    }
}

// Drifting and jumping statistics: never over budget; within 0.02 bits of the
// exact solver on a slow drift (5 % per step) with the default 8 passes.
TEST(AllocFastSolver, TracksDriftAndJumps) {
  const int64_t num_sg = 20000, numel = num_sg * 256;
  const auto base = lognormal_stats(num_sg, 3.0, 0.2, 51);
  AllocParams p;
  p.solver = AllocSolver::kFast;
  AllocState st;
  std::vector<uint8_t> w(static_cast<size_t>(num_sg));
  std::vector<float> f = base;
  double worst_gap = 0;
  for (int step = 0; step < 80; ++step) {
    double scale = std::pow(1.05, step);
    if (step >= 40) scale *= 1e6;   // a sudden jump
    if (step >= 60) scale *= 1e-9;  // and back down
    for (size_t j = 0; j < f.size(); ++j) f[j] = float(base[j] * scale);
    const AllocResult r = dynamiq_allocate(f.data(), numel, p, st, w.data());
    ASSERT_LE(double(8 * r.wire_bytes), p.bits * double(numel)) << "step " << step;
    const AllocRun ex = run(f, numel, p.bits, kMaskDefault, AllocSolver::kExact);
    const double gap = ex.res.bits_per_coord - r.bits_per_coord;
    EXPECT_GE(gap, 0.0);
    // every step, the jumps included: a bracket out of reach of max_passes
    // makes the step search exactly
    worst_gap = std::max(worst_gap, gap);
  }
  EXPECT_LE(worst_gap, 0.02);
}

// From a converged state, the statistics of the next step up or down by a
// factor a training step can bring (gradient norms move by tens of percent):
// before the exact fallback, a 10 % rise left every SG at the narrowest width
// (2.56 bits of 5) and a fall to 1/4 used 4.18.
TEST(AllocFastSolver, OneStepChangesKeepTheBudgetUsed) {
  const int64_t num_sg = 30000, numel = num_sg * 256;
  const auto base = lognormal_stats(num_sg, 3.0, 0.2, 52);
  AllocParams p;
  p.solver = AllocSolver::kFast;
  for (double jump : {1.01, 1.05, 1.1, 1.3, 2.0, 4.0, 0.9, 0.5, 0.25}) {
    SCOPED_TRACE("jump " + std::to_string(jump));
    AllocState st;
    std::vector<uint8_t> w(static_cast<size_t>(num_sg));
    for (int i = 0; i < 6; ++i) dynamiq_allocate(base.data(), numel, p, st, w.data());
    std::vector<float> f(base);
    for (auto& x : f) x = float(double(x) * jump);
    const AllocResult r = dynamiq_allocate(f.data(), numel, p, st, w.data());
    const AllocRun ex = run(f, numel, p.bits, kMaskDefault, AllocSolver::kExact);
    EXPECT_LE(double(8 * r.wire_bytes), p.bits * double(numel));
    EXPECT_LE(ex.res.bits_per_coord - r.bits_per_coord, 0.02) << "fallback " << r.exact_fallback;
    for (size_t j = 0; j < f.size(); ++j) ASSERT_LE(w[j], ex.w[j]) << "SG " << j;
  }
}

// AllocResult::exact_search says whether a search over C ran (the hook reports it).
TEST(AllocFastSolver, ExactSearchFlagSaysWhenASearchRan) {
  const int64_t num_sg = 3000, numel = num_sg * 256;
  const auto f = lognormal_stats(num_sg, 3.0, 0.2, 53);
  std::vector<uint8_t> w(static_cast<size_t>(num_sg));
  AllocParams p;
  p.solver = AllocSolver::kFast;
  AllocState st;
  EXPECT_TRUE(dynamiq_allocate(f.data(), numel, p, st, w.data()).exact_search);  // cold
  const AllocResult warm = dynamiq_allocate(f.data(), numel, p, st, w.data());
  EXPECT_FALSE(warm.exact_search);
  EXPECT_FALSE(warm.exact_fallback);
  std::vector<float> g(f);
  for (auto& x : g) x *= 2.0f;
  const AllocResult jump = dynamiq_allocate(g.data(), numel, p, st, w.data());
  EXPECT_TRUE(jump.exact_search && jump.exact_fallback);
  p.solver = AllocSolver::kExact;
  EXPECT_TRUE(dynamiq_allocate(f.data(), numel, p, st, w.data()).exact_search);
  // a budget that fits every SG at the widest width: nothing to search
  for (AllocSolver s : {AllocSolver::kExact, AllocSolver::kFast}) {
    p.solver = s;
    p.bits = 9.0;
    AllocState fresh;
    const AllocResult r = dynamiq_allocate(f.data(), numel, p, fresh, w.data());
    EXPECT_FALSE(r.exact_search);
    EXPECT_EQ(r.width_count[dynamiq_width_index(8)], num_sg);
  }
}

// ---- performance sanity (printed, not asserted) ---------------------------------

double thread_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

// Wall and thread CPU time (the machine may be shared), fresh plan and a
// reused one (no page faults).
TEST(AllocPerformance, OneMillionSuperGroups) {
  const int64_t num_sg = 1 << 20, numel = num_sg * 256;
  const auto f = lognormal_stats(num_sg, 3.0, 0.2, 61);
  using clk = std::chrono::steady_clock;
  Plan reused;
  for (const char* mode : {"exact", "fast (cold)", "fast (warm)"})
    for (bool reuse : {false, true}) {
      AllocParams p;
      p.solver = mode[0] == 'e' ? AllocSolver::kExact : AllocSolver::kFast;
      AllocState st;
      if (mode[0] == 'f' && mode[6] == 'w') fill_dynamiq_plan(reused, DType::kF32, numel, f.data(), 1, p, st, 8);
      AllocResult res;
      const auto t0 = clk::now();
      const double c0 = thread_cpu_ms();
      if (reuse) {
        res = fill_dynamiq_plan(reused, DType::kF32, numel, f.data(), 1, p, st, 8);
      } else {
        const Plan plan = make_dynamiq_plan(DType::kF32, numel, f.data(), 1, p, st, 8, SgLayout::kBalancedByWidth, &res);
        EXPECT_EQ(plan.wire_offset.back(), res.wire_bytes);
      }
      const double cpu = thread_cpu_ms() - c0;
      const double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
      std::printf("[ perf ] 2^20 SGs, %-11s allocation + layout (8 chunks, %s plan): %6.2f ms wall, %6.2f ms cpu, %3d passes, %.4f bits/coord\n",
                  mode, reuse ? "reused" : "fresh ", ms, cpu, res.passes, res.bits_per_coord);
      EXPECT_LE(8.0 * double(res.wire_bytes), 5.0 * double(numel));
    }
}

}  // namespace
}  // namespace dynamiq
