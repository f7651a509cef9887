// Throughput of the DynamiQ CPU kernels on one core, in GB/s of *input*
// (numel x dtype bytes of the bucket), next to memcpy of the same bytes
// measured in the same run; prints the ratio kernel / memcpy.
//
//   build/cpp/bench_kernels [numel=16777216] [min_seconds=0.4] [filter]
// filter: a substring of "dtype/widths/rounding/kernel", e.g. "float32/mix5".
// DYNAMIQ_BENCH_HUGEPAGES=1: every large buffer (the buckets, messages,
// accumulator and the memcpy pair) on 2 MiB pages (madvise(MADV_HUGEPAGE)), as
// torch's CPU allocator does with THP_MEM_ALLOC_ENABLE=1; default: 4 KiB pages
// (this machine's transparent huge pages are "madvise" only).
//
// Kernels: stats (dynamiq_local_stats), compress (leaf), decompress (final
// values into the bucket), decompress_accumulate (into a float accumulator),
// fused decompress_accumulate_recompress (middle hop). Widths 2, 4, 8 and a
// "5-bit" mixture (30% 8-bit, 30% 4-bit, 40% 2-bit super-groups: 4.96 wire
// bits per coordinate with the scales), rounding independent and correlated
// (worlds 4 and 8: exact permutation table; world 16: swap-or-not). Plans look like
// the hook's: every super-group has its mean subtracted (plan.bias), and in
// the mixture the widths are scattered over the bucket (drawn per super-group)
// and the wire order groups them by width, as the allocator does, so the
// kernels read the bucket in runs of one super-group at scattered places.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/dynamiq/dynamiq_stats.h"
#include "kernels/base/cpu_isa.h"
#include "kernels/base/float_bits.h"
#include "kernels/base/parallel.h"

using namespace dynamiq;

namespace {

// This thread's CPU time (the machine is shared: wall time would count the
// time other processes hold the core). With DYNAMIQ_CPU_THREADS > 1 the
// kernels also run on helper threads, whose time this clock would miss: wall
// time then.
double thread_seconds() {
  timespec ts;
  clock_gettime(dynamiq_cpu_threads() > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best thread CPU time per call of fn over repeated calls totalling >= min_s seconds.
double time_best(const std::function<void()>& fn, double min_s) {
  fn();  // warm up (page faults, caches)
  double best = 1e30, total = 0;
  int reps = 0;
  while (total < min_s || reps < 3) {
    const double t0 = thread_seconds();
    fn();
    const double dt = thread_seconds() - t0;
    best = std::min(best, dt);
    total += dt;
    ++reps;
  }
  return best;
}

volatile uint8_t g_sink;

bool huge_pages() {
  static const bool on = [] {
    const char* e = std::getenv("DYNAMIQ_BENCH_HUGEPAGES");
    return e != nullptr && std::string(e) == "1";
  }();
  return on;
}

// The benchmark's buffers: 2 MiB-aligned and advised onto huge pages when
// huge_pages(), else 64-byte aligned. (The advice is only a request: the
// header line reports what the kernel granted.)
template <typename T>
struct BenchAlloc {
  using value_type = T;
  BenchAlloc() = default;
  template <typename U>
  BenchAlloc(const BenchAlloc<U>&) {}
  T* allocate(size_t n) {
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t bytes = std::max<size_t>(n * sizeof(T), 64);
    const size_t align = huge_pages() && bytes >= kHuge ? kHuge : 64;
    const size_t size = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple
    void* p = std::aligned_alloc(align, size);
    if (p == nullptr) throw std::bad_alloc();
    if (align == kHuge) madvise(p, size, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const BenchAlloc<U>&) const { return true; }
};
template <typename T>
using Buf = std::vector<T, BenchAlloc<T>>;

// AnonHugePages of this process (kB), from /proc/self/smaps_rollup; -1 if unreadable.
long anon_huge_kb() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  std::fclose(f);
  return kb;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t numel = argc > 1 ? std::atoll(argv[1]) : (int64_t(1) << 24);
  const double min_s = argc > 2 ? std::atof(argv[2]) : 0.4;
  const std::string filter = argc > 3 ? argv[3] : "";
  const DynamiqParams prm;
  const DynamiqCodec codec(prm);
  const int S = prm.fmt.S;
  const int64_t units = ceil_div<int64_t>(numel, S);

  std::mt19937_64 g(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Buf<float> xf(static_cast<size_t>(numel)), yf(static_cast<size_t>(numel));
  for (auto& v : xf) v = nd(g);
  for (auto& v : yf) v = nd(g);
  Buf<uint16_t> xb(static_cast<size_t>(numel)), xh(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    xb[size_t(i)] = f32_to_bf16(xf[size_t(i)]);
    xh[size_t(i)] = f32_to_f16(xf[size_t(i)]);
  }

  const int nthreads = dynamiq_cpu_threads();
  std::printf("# dynamiq CPU kernels, %d thread%s (DYNAMIQ_CPU_THREADS; %s), isa=%s (DYNAMIQ_CPU_ISA=avx2 "
              "forces AVX2), numel=%lld, S=%d s=%d, eps=(%.3g,%.3g), scales %s\n",
              nthreads, nthreads > 1 ? "s" : "",
              nthreads > 1 ? "wall time; memcpy stays one thread" : "thread CPU time",
              dynamiq_cpu_isa().c_str(), (long long)numel, S, prm.fmt.s, prm.eps[2], prm.eps[3],
              prm.stochastic_group_scales ? "stochastic" : "up");
  std::printf("# memcpy column: the same bytes copied right after each row's kernel (best of %.2g s)\n",
              min_s / 2);
  std::printf("# pages: %s (DYNAMIQ_BENCH_HUGEPAGES=1 asks for 2 MiB); AnonHugePages after the inputs: %ld kB\n",
              huge_pages() ? "2 MiB requested" : "4 KiB", anon_huge_kb());
  std::printf("%-6s %-10s %-12s %-24s %9s %9s %7s %9s\n", "dtype", "widths", "rounding", "kernel",
              "GB/s", "memcpy", "ratio", "ns/elem");

  struct Mix {
    const char* name;
    std::vector<uint8_t> bits;
  };
  std::vector<Mix> mixes;
  for (int b : {2, 4, 8}) mixes.push_back({b == 2 ? "2" : b == 4 ? "4" : "8", std::vector<uint8_t>(size_t(units), uint8_t(b))});
  {
    std::vector<uint8_t> bits(static_cast<size_t>(units));
    std::mt19937_64 gb(7);
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (int64_t u = 0; u < units; ++u) {
      const double f = ud(gb);
      bits[size_t(u)] = f < 0.3 ? 8 : f < 0.6 ? 4 : 2;  // scattered over the bucket
    }
    mixes.push_back({"mix5", bits});
  }
  // wire order: grouped by width (8, 4, 2), source order within a width
  auto width_order = [&](const std::vector<uint8_t>& bits) {
    std::vector<int32_t> order(static_cast<size_t>(units));
    for (int64_t u = 0; u < units; ++u) order[size_t(u)] = int32_t(u);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return bits[size_t(a)] > bits[size_t(b)]; });
    return order;
  };
  // per-super-group means, as the hook subtracts them (small against the values)
  std::vector<float> bias(static_cast<size_t>(units));
  for (auto& v : bias) v = 0.01f * nd(g);
  struct Round {
    const char* name;
    bool corr;
    int world;
    bool stochastic;
  };
  // "nearest" (no random numbers: biased, an ablation) shows what the RNG costs.
  const Round rounds[] = {{"independent", false, 8, true}, {"corr n=4", true, 4, true},
                          {"corr n=8", true, 8, true},     {"corr n=16", true, 16, true},
                          {"nearest", false, 8, false}};

  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const void* xin = dt == DType::kF32    ? static_cast<const void*>(xf.data())
                      : dt == DType::kBF16 ? static_cast<const void*>(xb.data())
                                           : static_cast<const void*>(xh.data());
    const size_t in_bytes = size_t(numel) * size_t(dtype_size(dt));
    Buf<uint8_t> src(in_bytes), dst(in_bytes);
    std::memcpy(src.data(), xin, in_bytes);
    // memcpy bandwidth drifts with the machine's load (7-13 GB/s in one
    // session), so each row's memcpy is timed right after its kernel
    auto memcpy_gbs_now = [&] {
      const double t_memcpy = time_best([&] {
        std::memcpy(dst.data(), src.data(), in_bytes);
        g_sink = dst[in_bytes / 2];
      }, min_s / 2);
      return double(in_bytes) / t_memcpy / 1e9;
    };
    auto report = [&](const char* widths, const char* rounding, const char* kernel, double t) {
      const double gbs = double(in_bytes) / t / 1e9;
      const double memcpy_gbs = memcpy_gbs_now();
      std::printf("%-6s %-10s %-12s %-24s %9.2f %9.2f %7.2f %9.3f\n", dtype_name(dt), widths, rounding,
                  kernel, gbs, memcpy_gbs, gbs / memcpy_gbs, t / double(numel) * 1e9);
      std::fflush(stdout);
    };
    // filter: substring of "dtype/widths/rounding/kernel"
    std::string cur_w = "-", cur_r = "-";
    auto want = [&](const std::string& k) {
      const std::string key = std::string(dtype_name(dt)) + "/" + cur_w + "/" + cur_r + "/" + k;
      return filter.empty() || key.find(filter) != std::string::npos;
    };

    if (want("stats")) {
      std::vector<float> st(size_t(2 * units));
      report("-", "-", "stats", time_best([&] { dynamiq_local_stats(xin, dt, numel, S, st.data()); }, min_s));
    }
    for (const Mix& mx : mixes) {
      const std::vector<int32_t> order = width_order(mx.bits);
      Plan p = make_dynamiq_plan(dt, numel, prm.fmt, mx.bits, order, bias, 1);
      Plan pf = make_dynamiq_plan(DType::kF32, numel, prm.fmt, mx.bits, order, bias, 1);
      const Block all{0, units};
      const size_t wb = codec.static_bytes(p, all);
      Buf<uint8_t> msg(wb), out(wb);
      Buf<float> acc(size_t(units) * size_t(S));
      Local lx;
      lx.bucket = xin;
      for (const Round& rd : rounds) {
        cur_w = mx.name;
        cur_r = rd.name;
        RngCtx r;
        r.key = make_rng_key(1, 2);
        r.world = rd.world;
        r.rank = 3;
        r.correlated = rd.corr;
        r.stochastic = rd.stochastic;
        if (!want("compress") && !want("decompress_acc_recompress") && !want("decompress_accumulate") &&
            !want("decompress"))
          continue;
        // the "received" message: another rank's compression of y
        {
          Local ly;
          ly.bucket = yf.data();
          codec.compress(ly, pf, all, r, msg.data());
        }
        if (want("compress"))
          report(mx.name, rd.name, "compress", time_best([&] { codec.compress(lx, p, all, r, out.data()); }, min_s));
        if (want("decompress_acc_recompress"))
          report(mx.name, rd.name, "decompress_acc_recompress", time_best([&] {
                   codec.decompress_accumulate_recompress(msg.data(), wb, lx, p, all, r, out.data());
                 }, min_s));
        if (rd.corr || !rd.stochastic) continue;  // decoders do not depend on the rounding
        cur_r = "-";
        if (want("decompress_accumulate"))
          report(mx.name, "-", "decompress_accumulate", time_best([&] {
                   codec.decompress_accumulate(msg.data(), wb, lx, p, all, acc.data());
                 }, min_s));
        if (want("decompress")) {
          Buf<uint8_t> bucket(in_bytes);
          Output y;
          y.bucket = bucket.data();
          y.bias_scale = 8.0f;
          y.divisor = 8.0f;
          report(mx.name, "-", "decompress", time_best([&] { codec.decompress(msg.data(), wb, p, all, y); }, min_s));
        }
      }
    }
  }
  std::printf("# AnonHugePages at the end: %ld kB\n", anon_huge_kb());
  return 0;
}
