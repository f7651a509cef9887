// Choosing eps (the non-uniformity of the DynamiQ levels) per width, and the
// group-scale rounding: vNMSE as a function of eps for widths 2, 4, 8 on
// Gaussian and Student-t(3) data, for
//   one:  one quantisation of a vector (compress, decompress);
//   ring: a 4-hop ring partial-sum chain as the ring all-reduce runs it for one
//         chunk: rank 0 compresses x0, ranks 1..3 each decompress, add their own
//         x_r and recompress (the fused kernel), the last message is the
//         result; vNMSE against the exact sum x0+..+x3. Correlated rounding,
//         world 4.
// Prints markdown tables (experiments/results/dynamiq_eps/).
//
// Build and run (a benchmark target: cmake -DDYNAMIQ_BUILD_BENCHMARKS=ON):
//   ninja -C build/cpp dynamiq_eps && build/cpp/dynamiq_eps
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/dynamiq/dynamiq_codec.h"

using namespace dynamiq;

namespace {

std::vector<float> make_data(int dist, size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> z(0.0, 1.0);
  std::chi_squared_distribution<double> c(3.0);
  std::vector<float> x(n);
  for (auto& v : x) v = float(dist == 0 ? z(g) : z(g) / std::sqrt(c(g) / 3.0));
  return x;
}

RngCtx ctx(uint64_t seq, int rank, int world) {
  RngCtx r;
  r.key = make_rng_key(2024, seq);
  r.rank = rank;
  r.world = world;
  r.correlated = true;
  return r;
}

std::vector<double> decode(const DynamiqCodec& c, const Plan& p, const std::vector<uint8_t>& msg) {
  std::vector<float> zeros(size_t(p.num_units * p.unit), 0.0f), acc(zeros.size());
  Local z;
  z.acc = zeros.data();
  c.decompress_accumulate(msg.data(), msg.size(), z, p, Block{0, p.num_units}, acc.data());
  return std::vector<double>(acc.begin(), acc.begin() + p.numel);
}

// vNMSE of one quantisation and of the 4-hop chain, averaged over `reps` draws.
void measure(const DynamiqCodec& codec, int width, int dist, size_t n, int reps, double& one,
             double& ring) {
  const int64_t units = ceil_div<int64_t>(int64_t(n), codec.params().fmt.S);
  Plan p = make_dynamiq_plan(DType::kF32, int64_t(n), codec.params().fmt,
                             std::vector<uint8_t>(size_t(units), uint8_t(width)), {}, {}, 1);
  const Block all{0, units};
  const size_t bytes = codec.static_bytes(p, all);
  double e1 = 0, s1 = 0, e4 = 0, s4 = 0;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < 4; ++r) x.push_back(make_data(dist, n, uint64_t(1000 * rep + 10 * dist + r)));
    std::vector<uint8_t> msg(bytes), next(bytes);
    Local l0;
    l0.bucket = x[0].data();
    codec.compress(l0, p, all, ctx(uint64_t(rep), 0, 4), msg.data());
    const auto d0 = decode(codec, p, msg);
    for (size_t i = 0; i < n; ++i) {
      e1 += (d0[i] - x[0][i]) * (d0[i] - x[0][i]);
      s1 += double(x[0][i]) * x[0][i];
    }
    for (int r = 1; r < 4; ++r) {
      Local lr;
      lr.bucket = x[size_t(r)].data();
      codec.decompress_accumulate_recompress(msg.data(), bytes, lr, p, all, ctx(uint64_t(rep), r, 4), next.data());
      msg.swap(next);
    }
    const auto d = decode(codec, p, msg);
    for (size_t i = 0; i < n; ++i) {
      const double sum = double(x[0][i]) + x[1][i] + x[2][i] + x[3][i];
      e4 += (d[i] - sum) * (d[i] - sum);
      s4 += sum * sum;
    }
  }
  one = e1 / s1;
  ring = e4 / s4;
}

}  // namespace

int main() {
  const size_t n = size_t(1) << 17;
  const int reps = 3;
  const float eps_grid[] = {0.0f, 0.02f, 0.04f, 0.06f, 0.08f, 0.1f, 0.15f, 0.2f,
                            0.25f, 0.3f, 0.4f, 0.5f, 0.7f, 1.0f};
  std::printf("n = %zu values per vector, %d repetitions, S=256, s=16, hierarchical scales\n\n", n, reps);
  for (int scales = 0; scales < 2; ++scales) {
    std::printf("### group scales: %s\n\n", scales ? "stochastic (paper)" : "rounded up");
    for (int width : {2, 4, 8}) {
      std::printf("width %d\n\n| eps | one: gauss | one: t3 | ring4: gauss | ring4: t3 | geo-mean / eps=0 |\n"
                  "|---|---|---|---|---|---|\n", width);
      double base[4] = {0, 0, 0, 0};
      double best = 1e30;
      float best_eps = 0;
      for (float eps : eps_grid) {
        DynamiqParams prm;
        prm.eps[size_t(width == 2 ? 1 : width == 4 ? 2 : 3)] = eps;  // others at their defaults
        prm.stochastic_group_scales = scales != 0;
        try {
          DynamiqCodec codec(prm);
          double v[4];
          measure(codec, width, 0, n, reps, v[0], v[2]);
          measure(codec, width, 1, n, reps, v[1], v[3]);
          if (eps == 0.0f)
            for (int k = 0; k < 4; ++k) base[k] = v[k];
          double g = 1;
          for (int k = 0; k < 4; ++k) g *= v[k] / base[k];
          g = std::pow(g, 0.25);
          if (g < best) {
            best = g;
            best_eps = eps;
          }
          std::printf("| %.2f | %.4g | %.4g | %.4g | %.4g | %.3f |\n", eps, v[0], v[1], v[2], v[3], g);
        } catch (const Error& e) {
          std::printf("| %.2f | levels collapse in float32 | | | | |\n", eps);
        }
        std::fflush(stdout);
      }
      std::printf("\nbest eps for width %d: %.2f (geo-mean %.3f of uniform)\n\n", width, best_eps, best);
    }
  }
  return 0;
}
