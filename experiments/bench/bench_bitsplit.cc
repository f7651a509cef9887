// Bit-split codec benchmark (not a test):
//   1. vNMSE and wire bits per coordinate of one compress/decompress, INT2-INT8,
//      with and without spike reserving, nearest vs stochastic rounding, on
//      Gaussian, heavy-tailed (Student t, 3 dof) and Gaussian-with-outliers data;
//   2. vNMSE of the all-reduced sum and bytes sent per rank, twostep / ring /
//      butterfly at n = 2, 4, 8 ranks (in-process transport);
//   3. single-thread CPU kernel throughput (GB/s of input: compress,
//      decompress, decompress-accumulate, fused decompress-accumulate-
//      recompress) against memcpy of the same bytes, measured in the same run.
//
// Usage: bench_bitsplit [--quick] [--throughput] [--numel N] [--reps R]
//   --throughput: only table 3 (DYNAMIQ_CPU_THREADS=2: codec calls on 2 threads, wall time)
#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "../../tests/cpp/params_util.h"
#include "kernels//bitsplit/bitsplit_codec.h"
#include "kernels/base/float_bits.h"
#include "kernels/base/parallel.h"

using namespace dynamiq;

namespace {

// This thread's CPU time in seconds. The benchmark machines are shared: CPU
// time does not count the time other processes hold the core (wall time
// does), and memcpy is timed the same way in the same run. With
// DYNAMIQ_CPU_THREADS > 1 the codec calls also run on helper threads, which
// this clock would miss: wall time then.
double thread_seconds() {
  timespec t;
  clock_gettime(dynamiq_cpu_threads() > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Best-of-`reps` time of fn() in seconds (after one warm-up call).
double best_time(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_seconds();
    fn();
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}

std::vector<float> make_data(const std::string& kind, int64_t n, uint32_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> v(static_cast<size_t>(n));
  if (kind == "gaussian") {
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& e : v) e = d(g);
  } else if (kind == "student_t3") {
    std::student_t_distribution<float> d(3.0f);
    for (auto& e : v) e = d(g);
  } else {  // gaussian with one +-50 sigma outlier per 128 elements
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& e : v) e = d(g);
    for (int64_t i = 0; i < n; i += 128) v[size_t(i + int64_t(g() % 128)) % v.size()] = (g() & 1) ? 50.f : -50.f;
  }
  return v;
}

struct Buf {
  DType dt;
  std::vector<float> f;
  std::vector<uint16_t> h;
  void* data() { return dt == DType::kF32 ? static_cast<void*>(f.data()) : h.data(); }
  float at(size_t i) const {
    return dt == DType::kF32 ? f[i] : dt == DType::kBF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  }
};

Buf to_buf(DType dt, const std::vector<float>& v) {
  Buf b{dt, {}, {}};
  if (dt == DType::kF32) {
    b.f = v;
  } else {
    b.h.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) b.h[i] = dt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  }
  return b;
}

BitsplitCodec codec_of(int bits, int spikes, bool log_scales) {
  return BitsplitCodec(resolve_bitsplit_params(bits, 0, spikes, log_scales));
}

RngCtx rng(bool stochastic) {
  RngCtx r;
  r.key = make_rng_key(1, 2);
  r.rank = 0;
  r.stochastic = stochastic;
  return r;
}

// One compress + decompress of the whole bucket: vNMSE and wire bits/coordinate.
void quality_table(int64_t n) {
  const char* kinds[] = {"gaussian", "student_t3", "outliers"};
  std::vector<std::vector<float>> data;
  for (const char* k : kinds) data.push_back(make_data(k, n, 7));
  std::printf("\n## vNMSE of one quantisation (float32 bucket, %lld elements, group size = paper default)\n\n",
              (long long)n);
  std::printf("| bits | G | spikes | log scales | bits/coord | gaussian nearest | gaussian stoch. | student_t3 nearest | student_t3 stoch. | outliers nearest | outliers stoch. |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int bits = 2; bits <= 8; ++bits)
    for (int sp = 0; sp <= 1; ++sp)
      for (int lg = 0; lg <= 1; ++lg) {
        if (lg && !sp) continue;  // log scales shown with spikes (the paper's table 4 row)
        BitsplitCodec c = codec_of(bits, sp, lg);
        Plan plan = c.make_plan(DType::kF32, n, 1);
        Block blk{0, plan.num_units};
        std::vector<uint8_t> msg(c.static_bytes(plan, blk));
        std::printf("| %d | %d | %s | %s | %.3f |", bits, c.params().group, sp ? "on" : "off",
                    lg ? "on" : "off", 8.0 * double(msg.size()) / double(n));
        for (size_t k = 0; k < data.size(); ++k)
          for (int st = 0; st <= 1; ++st) {
            Local x;
            x.bucket = data[k].data();
            c.compress(x, plan, blk, rng(st), msg.data());
            std::vector<float> y(static_cast<size_t>(n));
            Output o;
            o.bucket = y.data();
            c.decompress(msg.data(), msg.size(), plan, blk, o);
            double num = 0, den = 0;
            for (int64_t i = 0; i < n; ++i) {
              const double d = double(y[size_t(i)]) - data[k][size_t(i)];
              num += d * d;
              den += double(data[k][size_t(i)]) * data[k][size_t(i)];
            }
            std::printf(" %.3e |", num / den);
          }
        std::printf("\n");
      }
}

// The whole collective: n ranks (threads) with iid N(0,1) buckets.
void allreduce_table(int64_t n) {
  std::printf("\n## All-reduce over the in-process transport (%lld float32 elements per rank, iid N(0,1), seed 42)\n\n",
              (long long)n);
  std::printf("vNMSE of the summed bucket against the exact sum (double); bytes = bytes sent by rank 0 / bytes the same rank sends with mode none.\n\n");
  std::printf("| setting | topology | vNMSE n=2 | n=4 | n=8 | bytes ratio n=2 | n=4 | n=8 |\n|---|---|---|---|---|---|---|---|\n");
  struct S {
    const char* name;
    int bits, sp;
    bool st;
  };
  const S settings[] = {{"INT2+SR stochastic", 2, -1, true}, {"INT4 stochastic", 4, -1, true},
                        {"INT4 nearest", 4, -1, false}, {"INT8 stochastic", 8, -1, true}};
  for (const S& st : settings)
    for (Topology topo : schedule_topologies()) {
      double err[3], ratio[3];
      int idx = 0;
      for (int world : {2, 4, 8}) {
        std::vector<std::vector<float>> in(static_cast<size_t>(world)), out;
        std::vector<double> exact(static_cast<size_t>(n), 0.0);
        for (int r = 0; r < world; ++r) {
          in[size_t(r)] = make_data("gaussian", n, uint32_t(100 + r));
          for (int64_t i = 0; i < n; ++i) exact[size_t(i)] += in[size_t(r)][size_t(i)];
        }
        int64_t sent[2] = {0, 0};
        for (int mode = 0; mode < 2; ++mode) {
          CollectiveConfig cfg;
          cfg.mode = mode == 0 ? mode_id("bitsplit") : mode_id("none");
          cfg.topology = topo;
          cfg.params.set("bits", double(st.bits));
          set_spike_reserve(cfg.params, st.sp);
          cfg.params.set("rounding", (st.st) ? "stochastic" : "nearest");
          cfg.seed = 42;
          out = in;
          InprocWorld w(world);
          w.run([&](int r, Transport& t) {
            CallArgs a;
            a.data = out[size_t(r)].data();
            a.numel = n;
            a.seq = 1;
            CallStats cs = all_reduce(t, cfg, a);
            if (r == 0) sent[mode] = cs.bytes_sent;
          });
          if (mode == 0) {
            double num = 0, den = 0;
            for (int64_t i = 0; i < n; ++i) {
              const double d = out[0][size_t(i)] - exact[size_t(i)];
              num += d * d;
              den += exact[size_t(i)] * exact[size_t(i)];
            }
            err[idx] = num / den;
          }
        }
        ratio[idx] = double(sent[0]) / double(sent[1]);
        ++idx;
      }
      std::printf("| %s | %s | %.3e | %.3e | %.3e | %.4f | %.4f | %.4f |\n", st.name, topology_name(topo), err[0],
                  err[1], err[2], ratio[0], ratio[1], ratio[2]);
    }
}

void throughput_table(int64_t n, int reps) {
  const int threads = dynamiq_cpu_threads();
  if (threads > 1)
    std::printf("\n## CPU kernel throughput, %d threads per call (DYNAMIQ_CPU_THREADS; %lld elements per call, "
                "best of %d, wall time; memcpy stays one thread)\n\n",
                threads, (long long)n, reps);
  else
    std::printf("\n## CPU kernel throughput, one thread (%lld elements per call, best of %d, thread CPU time)\n\n",
                (long long)n, reps);
  std::printf("GB/s of input = bucket bytes (numel x dtype size) / time; memcpy = memcpy of the same bytes in this run; ratio = kernel / memcpy.\n\n");
  std::printf("| dtype | bits | spikes | log | rounding | memcpy GB/s | compress GB/s (ratio) | decompress GB/s (ratio) | decomp-acc GB/s (ratio) | fused DAR GB/s (ratio) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const auto base = make_data("gaussian", n, 3);
  const auto other = make_data("gaussian", n, 4);
  struct Cfg {
    DType dt;
    int bits, sp;
    bool lg, st;
  };
  const Cfg cfgs[] = {
      {DType::kF32, 2, 1, false, true},  {DType::kF32, 2, 1, false, false}, {DType::kF32, 2, 1, true, true},
      {DType::kF32, 3, 1, false, true},  {DType::kF32, 4, 0, false, true},  {DType::kF32, 4, 0, false, false},
      {DType::kF32, 5, 0, false, true},  {DType::kF32, 6, 0, false, true},  {DType::kF32, 7, 0, false, true},
      {DType::kF32, 8, 0, false, true},  {DType::kF32, 8, 0, false, false}, {DType::kBF16, 2, 1, false, true},
      {DType::kBF16, 4, 0, false, true}, {DType::kBF16, 8, 0, false, true},
  };
  for (const Cfg& k : cfgs) {
    Buf a = to_buf(k.dt, base), b = to_buf(k.dt, other);
    const size_t bytes = size_t(n) * size_t(dtype_size(k.dt));
    std::vector<uint8_t> src(bytes), dst(bytes);
    std::memcpy(src.data(), a.data(), bytes);
    const double t_mem = best_time(reps, [&] { std::memcpy(dst.data(), src.data(), bytes); });
    BitsplitCodec c = codec_of(k.bits, k.sp, k.lg);
    Plan plan = c.make_plan(k.dt, n, 1);
    Block blk{0, plan.num_units};
    std::vector<uint8_t> in(c.static_bytes(plan, blk)), out(in.size());
    std::vector<float> acc(size_t(plan.num_units * plan.unit));
    Local xa;
    xa.bucket = a.data();
    Local xb;
    xb.bucket = b.data();
    c.compress(xb, plan, blk, rng(k.st), in.data());
    Buf y = to_buf(k.dt, std::vector<float>(size_t(n)));
    Output o;
    o.bucket = y.data();
    const double t_c = best_time(reps, [&] { c.compress(xa, plan, blk, rng(k.st), out.data()); });
    const double t_d = best_time(reps, [&] { c.decompress(in.data(), in.size(), plan, blk, o); });
    const double t_da = best_time(reps, [&] { c.decompress_accumulate(in.data(), in.size(), xa, plan, blk, acc.data()); });
    const double t_dar = best_time(reps, [&] {
      c.decompress_accumulate_recompress(in.data(), in.size(), xa, plan, blk, rng(k.st), out.data());
    });
    const double gm = bytes / t_mem / 1e9;
    auto cell = [&](double t) {
      static char s[64];
      std::snprintf(s, sizeof s, "%.2f (%.3f)", bytes / t / 1e9, (bytes / t / 1e9) / gm);
      return std::string(s);
    };
    std::printf("| %s | %d | %s | %s | %s | %.2f | %s | %s | %s | %s |\n", dtype_name(k.dt), k.bits,
                k.sp ? "on" : "off", k.lg ? "on" : "off", k.st ? "stochastic" : "nearest", gm,
                cell(t_c).c_str(), cell(t_d).c_str(), cell(t_da).c_str(), cell(t_dar).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t(1) << 22;
  int reps = 5;
  bool quick = false, throughput_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--throughput") throughput_only = true;
    else if (a == "--numel" && i + 1 < argc) n = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  if (quick) {
    n = int64_t(1) << 18;
    reps = 2;
  }
  if (!throughput_only) {
    quality_table(n);
    allreduce_table(quick ? n : n / 4);
  }
  throughput_table(n, reps);
  return 0;
}
