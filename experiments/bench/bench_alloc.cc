// Allocator and layout timing, and allocation quality, on super-group
// statistics: synthetic log-normal ones, or a raw float32 file of F_j values
// (e.g. sums of squares of real gradients).
//
//   build/cpp/bench_alloc [num_sg=1048576] [bits=5] [chunks=8] [stats.f32 [steps]]
//
// With `steps`, the file holds that many consecutive steps of one bucket's
// statistics; they are also run as a stream (exact each step vs the fast
// solver carrying u) to show how close the fast solver stays on real drift.
//
// Times are thread CPU time, best of 7 (the machine is shared; CPU time does
// not count the time another process holds the core), next to a memcpy of the
// statistics measured the same way in the same run. Quality: bits per
// coordinate used by each solver, the fraction of SGs per width, and the
// section-3.2 error proxy sum_j F_j 4^-w_j against the best single width that
// fits the budget.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "alloc/dynamiq_alloc.h"
#include "alloc/dynamiq_layout.h"

using namespace dynamiq;

double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

template <class F>
double best_ms(int reps, F&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_ms();
    fn();
    best = std::min(best, cpu_ms() - t0);
  }
  return best;
}

double proxy(const std::vector<float>& f, const std::vector<uint8_t>& w) {
  double s = 0;
  for (size_t j = 0; j < f.size(); ++j) s += double(f[j]) * std::ldexp(1.0, -2 * w[j]);
  return s;
}

struct Dataset {
  std::string name;
  std::vector<float> f;
};

void timing(const Dataset& d, double bits, int chunks) {
  const int reps = 7;
  const int64_t num_sg = int64_t(d.f.size()), numel = num_sg * 256;
  std::vector<float> copy(d.f.size());
  const double t_copy = best_ms(reps, [&] { std::memcpy(copy.data(), d.f.data(), d.f.size() * 4); });
  auto row = [&](const char* what, double ms, int passes) {
    std::printf("| %s | %s | %.3f | %.1f | %d |\n", d.name.c_str(), what, ms, ms / t_copy, passes);
  };
  row("memcpy of the stats", t_copy, 0);
  std::vector<uint8_t> w(d.f.size());
  AllocParams p;
  p.bits = bits;
  AllocResult res;
  p.solver = AllocSolver::kExact;
  AllocState st;
  double t = best_ms(reps, [&] { res = dynamiq_allocate(d.f.data(), numel, p, st, w.data()); });
  row("exact", t, res.passes);
  p.solver = AllocSolver::kFast;
  t = best_ms(reps, [&] {
    AllocState cold;
    res = dynamiq_allocate(d.f.data(), numel, p, cold, w.data());
  });
  row("fast, first step (= exact search)", t, res.passes);
  AllocState warm;
  for (int i = 0; i < 5; ++i) dynamiq_allocate(d.f.data(), numel, p, warm, w.data());
  t = best_ms(reps, [&] {
    AllocState s = warm;
    res = dynamiq_allocate(d.f.data(), numel, p, s, w.data());
  });
  row("fast, warm step", t, res.passes);
  // The step after the statistics jump by 4x either way (one loss-scale change
  // under AMP: the warm bracket cannot close within max_passes, and the tie
  // fill's window can hold most SGs) or drift by 1 %.
  for (float jump : {4.0f, 0.25f, 1.01f}) {
    std::vector<float> fj(d.f);
    for (auto& x : fj) x *= jump;
    t = best_ms(reps, [&] {
      AllocState s = warm;
      res = dynamiq_allocate(fj.data(), numel, p, s, w.data());
    });
    row(jump == 4.0f ? "fast, step after a 4x jump" : jump < 1 ? "fast, step after a 1/4 jump"
                                                            : "fast, step after a 1% drift",
        t, res.passes);
  }
  dynamiq_allocate(d.f.data(), numel, p, warm, w.data());  // w as the warm step leaves it
  Plan plan;
  plan.numel = numel;
  plan.bits = w;
  t = best_ms(reps, [&] { dynamiq_layout(plan, DynamiqFormat{}, chunks); });
  row("layout only", t, 0);
  t = best_ms(reps, [&] {
    AllocState s = warm;
    res = fill_dynamiq_plan(plan, DType::kF32, numel, d.f.data(), 1, p, s, chunks);
  });
  row("fast warm + layout (reused plan)", t, res.passes);
  p.solver = AllocSolver::kExact;
  t = best_ms(reps, [&] { res = fill_dynamiq_plan(plan, DType::kF32, numel, d.f.data(), 1, p, st, chunks); });
  row("exact + layout (reused plan)", t, res.passes);
  t = best_ms(reps, [&] { make_dynamiq_plan(DType::kF32, numel, d.f.data(), 1, p, st, chunks); });
  row("exact + layout (fresh plan)", t, res.passes);
}

void quality(const Dataset& d, double bits) {
  const int64_t num_sg = int64_t(d.f.size()), numel = num_sg * 256;
  if (bits < dynamiq_min_feasible_bits(numel, kDynamiqWidthMaskDefault, {})) return;
  std::vector<uint8_t> we(d.f.size()), wf(d.f.size());
  AllocParams p;
  p.bits = bits;
  p.solver = AllocSolver::kExact;
  AllocState st;
  const AllocResult re = dynamiq_allocate(d.f.data(), numel, p, st, we.data());
  p.solver = AllocSolver::kFast;
  AllocState fs;
  AllocResult rf = dynamiq_allocate(d.f.data(), numel, p, fs, wf.data());
  const double first = rf.bits_per_coord;
  for (int i = 0; i < 3; ++i) rf = dynamiq_allocate(d.f.data(), numel, p, fs, wf.data());
  // Best single width within the budget.
  int single = 0;
  for (int w : {2, 4, 8})
    if (8.0 * double(dynamiq_sg_bytes(w, {})) * double(num_sg) <= bits * double(numel)) single = w;
  const double pe = proxy(d.f, we), pf = proxy(d.f, wf);
  const double pu = proxy(d.f, std::vector<uint8_t>(d.f.size(), uint8_t(single)));
  std::printf("| %s | %.2f | %.4f | %.4f / %.4f | %.1f / %.1f / %.1f %% | %d-bit: %.3g | %.4f |\n", d.name.c_str(),
              bits, re.bits_per_coord, first, rf.bits_per_coord, 100.0 * double(re.width_count[1]) / double(num_sg),
              100.0 * double(re.width_count[2]) / double(num_sg), 100.0 * double(re.width_count[3]) / double(num_sg),
              single, pu / pe, pf / pe);
}

int main(int argc, char** argv) {
  const int64_t num_sg = argc > 1 ? std::atoll(argv[1]) : (1 << 20);
  const double bits = argc > 2 ? std::atof(argv[2]) : 5.0;
  const int chunks = argc > 3 ? std::atoi(argv[3]) : 8;
  std::vector<Dataset> data;
  int steps = 0;
  std::vector<float> stream;
  for (double sigma : {1.0, 3.0, 6.0}) {
    std::mt19937_64 g(1);
    std::normal_distribution<double> nd(0, sigma);
    std::uniform_real_distribution<double> ud(0, 1);
    Dataset d;
    d.name = "log-normal sigma=" + std::to_string(int(sigma)) + ", 20% zero";
    d.f.resize(size_t(num_sg));
    for (auto& x : d.f) x = ud(g) < 0.2 ? 0.f : float(std::exp(nd(g)));
    data.push_back(std::move(d));
  }
  {
    // Ties (a threshold rule moves equal statistics together; fill_margin splits them):
    // a 16-value log-normal pattern repeated, and every SG equal.
    std::mt19937_64 g(2);
    std::normal_distribution<double> nd(0, 3.0);
    float pat[16];
    for (auto& x : pat) x = float(std::exp(nd(g)));
    Dataset t, e;
    t.name = "tiled 16-value pattern";
    e.name = "all equal";
    t.f.resize(size_t(num_sg));
    e.f.assign(size_t(num_sg), 7.0f);
    for (int64_t j = 0; j < num_sg; ++j) t.f[size_t(j)] = pat[j % 16];
    data.push_back(std::move(t));
    data.push_back(std::move(e));
  }
  if (argc > 4) {
    FILE* fp = std::fopen(argv[4], "rb");
    if (!fp) {
      std::fprintf(stderr, "cannot open %s\n", argv[4]);
      return 1;
    }
    Dataset d;
    d.name = argv[4];
    float x;
    while (std::fread(&x, 4, 1, fp) == 1) d.f.push_back(x);
    std::fclose(fp);
    steps = argc > 5 ? std::atoi(argv[5]) : 1;
    if (steps < 1 || d.f.size() % size_t(steps) != 0) {
      std::fprintf(stderr, "%zu values do not split into %d steps\n", d.f.size(), steps);
      return 1;
    }
    stream = d.f;
    d.f.resize(d.f.size() / size_t(steps));  // the first step for the tables
    data.push_back(std::move(d));
  }
  std::printf("budget %.3g bits, %d chunks, thread CPU time best of 7\n\n", bits, chunks);
  std::printf("| stats (SGs) | what | ms | x memcpy | passes |\n|---|---|---|---|---|\n");
  for (const Dataset& d : data) {
    Dataset named = d;
    named.name += " (" + std::to_string(d.f.size()) + ")";
    timing(named, bits, chunks);
  }
  std::printf("\n| stats | budget | exact bits | fast bits: first / after 3 warm steps | exact 2 / 4 / 8-bit SGs | "
              "error proxy of best single width / exact | fast / exact proxy |\n|---|---|---|---|---|---|---|\n");
  for (const Dataset& d : data)
    for (double b : {3.0, 4.0, 5.0, 6.0, 8.0}) quality(d, b);
  {
    // Step-to-step jitter of the bucket's gradient scale (every F times
    // exp(sd * N(0, 1)), fresh each step), fast solver, 200 steps: how far
    // under the budget a step can end, and how many steps searched exactly
    // (passes > max_passes: the bracket was out of reach).
    const Dataset& d = data[1];  // log-normal sigma=3
    const int64_t n = int64_t(d.f.size()), numel = n * 256;
    std::printf("\njitter of the statistics' scale per step, %s, %lld SGs, budget %.3g bits, fast solver, 200 steps\n\n",
                d.name.c_str(), (long long)n, bits);
    std::printf("| jitter sd | steps that searched exactly | worst bits under the budget | mean ms per step |\n|---|---|---|---|\n");
    AllocParams p;
    p.bits = bits;
    std::vector<uint8_t> w(static_cast<size_t>(n));
    std::vector<float> fj(d.f.size());
    for (double sd : {0.01, 0.03, 0.05, 0.1}) {
      std::mt19937_64 g(3);
      std::normal_distribution<double> nd(0, 1);
      AllocState st;
      int exact_steps = 0;
      double worst = 0, total_ms = 0;
      for (int s = 0; s < 200; ++s) {
        const double k = std::exp(sd * nd(g));
        for (size_t j = 0; j < fj.size(); ++j) fj[j] = float(double(d.f[j]) * k);
        const double t0 = cpu_ms();
        const AllocResult r = dynamiq_allocate(fj.data(), numel, p, st, w.data());
        total_ms += cpu_ms() - t0;
        exact_steps += (s > 0 && r.passes > p.max_passes) ? 1 : 0;
        worst = std::max(worst, bits - r.bits_per_coord);
      }
      std::printf("| %.2f | %d / 199 | %.4f | %.3f |\n", sd, exact_steps, worst, total_ms / 200);
    }
  }
  if (steps > 1) {
    const size_t n = stream.size() / size_t(steps);
    const int64_t numel = int64_t(n) * 256;
    std::printf("\nstream of %d steps, %zu SGs, budget %.3g bits, fast solver max_passes 8\n\n", steps, n, bits);
    std::printf("| step | exact bits | fast bits | fast passes | fast u | SGs whose width differs |\n|---|---|---|---|---|---|\n");
    AllocParams p;
    p.bits = bits;
    AllocState fs, unused;
    std::vector<uint8_t> we(n), wf(n);
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      const float* f = stream.data() + size_t(s) * n;
      p.solver = AllocSolver::kExact;
      const AllocResult re = dynamiq_allocate(f, numel, p, unused, we.data());
      p.solver = AllocSolver::kFast;
      const AllocResult rf = dynamiq_allocate(f, numel, p, fs, wf.data());
      int64_t diff = 0;
      for (size_t j = 0; j < n; ++j) diff += we[j] != wf[j];
      worst = std::max(worst, re.bits_per_coord - rf.bits_per_coord);
      std::printf("| %d | %.4f | %.4f | %d | %.6f | %lld |\n", s, re.bits_per_coord, rf.bits_per_coord, rf.passes, fs.u,
                  (long long)diff);
    }
    std::printf("\nlargest exact - fast gap: %.4f bits per coordinate\n", worst);
  }
  return 0;
}
