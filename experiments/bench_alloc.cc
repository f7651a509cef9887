// Allocator and layout timing on synthetic heavy-tailed super-group statistics,
// next to a memcpy of the statistics measured in the same run, plus the bits
// each solver uses and the paper's error proxy sum_j F_j 4^-w_j against a
// uniform 4-bit allocation.
//
//   build/cpp/bench_alloc [num_sg=1048576] [bits=5] [chunks=8]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "alloc/dynamiq_alloc.h"
#include "alloc/dynamiq_layout.h"

using namespace dynamiq;
using clk = std::chrono::steady_clock;

template <class F>
double best_ms(int reps, F&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clk::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(clk::now() - t0).count());
  }
  return best;
}

// Error proxy of section 3.2: an SG of squared norm F at w bits has error ~ F 4^-w.
double proxy(const std::vector<float>& f, const std::vector<uint8_t>& w) {
  double s = 0;
  for (size_t j = 0; j < f.size(); ++j) s += double(f[j]) * std::ldexp(1.0, -2 * w[j]);
  return s;
}

int main(int argc, char** argv) {
  const int64_t num_sg = argc > 1 ? std::atoll(argv[1]) : (1 << 20);
  const double bits = argc > 2 ? std::atof(argv[2]) : 5.0;
  const int chunks = argc > 3 ? std::atoi(argv[3]) : 8;
  const int64_t numel = num_sg * 256;
  const int reps = 7;
  std::printf("num_sg=%lld numel=%lld bits=%.3g chunks=%d, best of %d\n", (long long)num_sg, (long long)numel,
              bits, chunks, reps);

  std::vector<float> copy(size_t(num_sg), 0.f);
  std::printf("%-26s %-10s %10s %10s %10s %12s\n", "stats", "what", "ms", "x memcpy", "passes", "bits/coord");
  for (double sigma : {1.0, 3.0, 6.0}) {
    std::mt19937_64 g(1);
    std::normal_distribution<double> nd(0, sigma);
    std::uniform_real_distribution<double> ud(0, 1);
    std::vector<float> f(static_cast<size_t>(num_sg));
    for (auto& x : f) x = ud(g) < 0.2 ? 0.f : float(std::exp(nd(g)));
    char name[64];
    std::snprintf(name, sizeof name, "lognormal s=%.0f, 20%% zero", sigma);
    const double t_copy = best_ms(reps, [&] { std::memcpy(copy.data(), f.data(), f.size() * 4); });
    std::printf("%-26s %-10s %10.3f %10.2f %10s %12s\n", name, "memcpy", t_copy, 1.0, "-", "-");

    std::vector<uint8_t> w(static_cast<size_t>(num_sg));
    AllocResult res;
    auto row = [&](const char* what, double ms, int passes, double b) {
      std::printf("%-26s %-10s %10.3f %10.2f %10d %12.4f\n", name, what, ms, ms / t_copy, passes, b);
    };
    AllocParams p;
    p.bits = bits;
    p.solver = AllocSolver::kExact;
    AllocState st;
    double t = best_ms(reps, [&] { res = dynamiq_allocate(f.data(), numel, p, st, w.data()); });
    row("exact", t, res.passes, res.bits_per_coord);
    const std::vector<uint8_t> w_exact = w;
    p.solver = AllocSolver::kFast;
    t = best_ms(reps, [&] {
      AllocState cold;
      res = dynamiq_allocate(f.data(), numel, p, cold, w.data());
    });
    row("fast cold", t, res.passes, res.bits_per_coord);
    AllocState warm;
    for (int i = 0; i < 5; ++i) dynamiq_allocate(f.data(), numel, p, warm, w.data());
    t = best_ms(reps, [&] {
      AllocState s = warm;
      res = dynamiq_allocate(f.data(), numel, p, s, w.data());
    });
    row("fast warm", t, res.passes, res.bits_per_coord);
    Plan plan;
    plan.numel = numel;
    plan.bits = w;
    t = best_ms(reps, [&] { dynamiq_layout(plan, DynamiqFormat{}, chunks); });
    row("layout", t, 0, 0.0);
    const double e_exact = proxy(f, w_exact), e_fast = proxy(f, w);
    const double e_uniform = proxy(f, std::vector<uint8_t>(size_t(num_sg), 4));
    std::printf("%-26s error proxy sum F 4^-w: exact %.4g, fast %.4g (x%.4f), uniform 4-bit %.4g (x%.2f of exact)\n",
                name, e_exact, e_fast, e_fast / e_exact, e_uniform, e_uniform / e_exact);
  }
  return 0;
}
