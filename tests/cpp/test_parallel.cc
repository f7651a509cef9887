// Splitting codec calls over CPU threads (csrc/kernels/parallel.h): the
// runs cover every unit once, a slow thread takes fewer runs, exceptions come
// back to the caller, the
// setting is validated, concurrent callers do not deadlock, and every DynamiQ
// and bitsplit kernel gives the same bytes / float bits with 1, 2 and 3
// threads as the single-threaded call (blocks that do not start at wire
// position 0 included, so parts must find their own wire offsets).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/bitsplit_codec.h"
#include "kernels/dynamiq_codec.h"
#include "kernels/parallel.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

using namespace dqtest;

struct ThreadScope {
  int before;
  explicit ThreadScope(int n) : before(dynamiq_set_cpu_threads(n)) {}
  ~ThreadScope() { dynamiq_set_cpu_threads(before); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
};

TEST(Parallel, SettingIsValidatedAndReturnsThePreviousValue) {
  const int start = dynamiq_cpu_threads();
  EXPECT_GE(start, 1);
  EXPECT_THROW(dynamiq_set_cpu_threads(0), Error);
  EXPECT_THROW(dynamiq_set_cpu_threads(-3), Error);
  EXPECT_THROW(dynamiq_set_cpu_threads(257), Error);
  EXPECT_EQ(dynamiq_cpu_threads(), start);
  EXPECT_EQ(dynamiq_set_cpu_threads(5), start);
  EXPECT_EQ(dynamiq_cpu_threads(), 5);
  EXPECT_EQ(dynamiq_set_cpu_threads(start), 5);
}

// Runs a parallel_units call over [w0, w0 + n) and records who took which units.
struct RunLog {
  std::vector<std::atomic<int>> hits;  // per unit
  std::atomic<int> parts{0};           // part() calls
  std::atomic<int64_t> longest{0};     // longest run handed out
  std::mutex m;
  std::vector<std::thread::id> part_threads;
  explicit RunLog(int64_t n) : hits(size_t(n)) {
    for (auto& h : hits) h = 0;
  }
};

void log_call(RunLog& log, int64_t w0, int64_t n, int64_t min_units, int64_t grain) {
  parallel_units(w0, w0 + n, min_units, grain, [&](UnitRuns& runs) {
    log.parts++;
    {
      std::lock_guard<std::mutex> lk(log.m);
      log.part_threads.push_back(std::this_thread::get_id());
    }
    for (int64_t u0, u1; runs.next(u0, u1);) {
      ASSERT_LE(w0, u0);
      ASSERT_LT(u0, u1);
      ASSERT_LE(u1, w0 + n);
      for (int64_t u = u0; u < u1; ++u) log.hits[size_t(u - w0)]++;
      int64_t cur = log.longest.load();
      while (u1 - u0 > cur && !log.longest.compare_exchange_weak(cur, u1 - u0)) {
      }
    }
  });
}

TEST(Parallel, RunsCoverEveryUnitOnce) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadScope ts(threads);
    for (int64_t n : {0, 1, 5, 63, 64, 65, 1000, 1001}) {
      for (int64_t min_units : {1, 16, 64}) {
        for (int64_t grain : {1, 7, 64}) {
          RunLog log(n);
          log_call(log, 17, n, min_units, grain);
          for (int64_t u = 0; u < n; ++u) ASSERT_EQ(log.hits[size_t(u)].load(), 1) << "unit " << u;
          const int64_t expect_parts =
              n == 0 ? 0 : std::min<int64_t>(threads, std::max<int64_t>(1, n / min_units));
          EXPECT_EQ(log.parts.load(), expect_parts) << "threads " << threads << " n " << n;
          std::vector<std::thread::id> ids = log.part_threads;
          std::sort(ids.begin(), ids.end());
          EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end()) << "one part per thread";
          if (expect_parts > 1) {
            EXPECT_LE(log.longest.load(), grain);
          } else if (n > 0) {
            EXPECT_EQ(log.longest.load(), n) << "one thread: one run of everything";
          }
        }
      }
    }
  }
}

// The point of handing out runs: a thread that is slow (costly units, or
// descheduled on a busy machine) takes fewer. Here the caller's thread sleeps
// 5 ms per unit; the helper's units take microseconds, so it should take
// nearly all of them (an equal split would leave the caller half: 32 units,
// 160 ms). The bound allows the helper to wake up to ~75 ms late.
TEST(Parallel, ASlowThreadTakesFewerUnits) {
  ThreadScope ts(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int64_t> mine{0}, helper{0};
  parallel_units(0, 64, 1, 1, [&](UnitRuns& runs) {
    const bool is_caller = std::this_thread::get_id() == caller;
    for (int64_t u0, u1; runs.next(u0, u1);) {
      if (is_caller) {
        mine += u1 - u0;
        std::this_thread::sleep_for(std::chrono::milliseconds(5) * (u1 - u0));
      } else {
        helper += u1 - u0;
      }
    }
  });
  EXPECT_EQ(mine.load() + helper.load(), 64);
  EXPECT_LE(mine.load(), 16) << "the helper took only " << helper.load() << " units";
}

TEST(Parallel, AnExceptionInAnyPartReachesTheCaller) {
  ThreadScope ts(3);
  for (int bad = 0; bad < 3; ++bad) {
    std::atomic<int64_t> done{0};
    EXPECT_THROW(parallel_units(0, 300, 1, 10,
                                [&](UnitRuns& runs) {
                                  for (int64_t u0, u1; runs.next(u0, u1);) {
                                    if (u0 <= 100 * bad && 100 * bad < u1) throw Error("run failed");
                                    done += u1 - u0;
                                  }
                                }),
                 Error);
    EXPECT_LT(done.load(), 300);
  }
  // a part that throws on one thread alone (no helpers) as well
  {
    ThreadScope one(1);
    EXPECT_THROW(parallel_units(0, 300, 1, 10, [&](UnitRuns&) { throw Error("part failed"); }),
                 Error);
  }
  // and the helpers are usable afterwards
  std::atomic<int64_t> sum{0};
  parallel_units(0, 300, 1, 10, [&](UnitRuns& runs) {
    for (int64_t u0, u1; runs.next(u0, u1);) sum += u1 - u0;
  });
  EXPECT_EQ(sum.load(), 300);
}

TEST(Parallel, ConcurrentCallersAllFinish) {
  ThreadScope ts(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int k = 0; k < 200; ++k)
        parallel_units(0, 64, 1, 4, [&](UnitRuns& runs) {
          for (int64_t u0, u1; runs.next(u0, u1);) total += u1 - u0;
        });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t(4) * 200 * 64);
}

// ---- every DynamiQ kernel: threads give the single-threaded bytes ------------------

struct Outputs {
  std::vector<uint8_t> comp, fused;
  std::vector<float> acc;
  std::vector<uint8_t> dec;  // the decompressed bucket's bytes
};

Outputs run_kernels(const Codec& codec, const Plan& plan, const Block& blk,
                    const std::vector<uint8_t>& bucket, const std::vector<uint8_t>& msg,
                    const RngCtx& rng) {
  Outputs o;
  Local x;
  x.bucket = bucket.data();
  const size_t bytes = codec.static_bytes(plan, blk);
  o.comp.assign(bytes, 0);
  EXPECT_EQ(codec.compress(x, plan, blk, rng, o.comp.data()), bytes);
  o.fused.assign(bytes, 0);
  EXPECT_EQ(codec.decompress_accumulate_recompress(msg.data(), bytes, x, plan, blk, rng,
                                                   o.fused.data()),
            bytes);
  o.acc.assign(size_t(blk.units() * plan.unit), -1.0f);
  codec.decompress_accumulate(msg.data(), bytes, x, plan, blk, o.acc.data());
  o.dec.assign(bucket.size(), 0xAB);
  Output y;
  y.bucket = o.dec.data();
  y.bias_scale = 4.0f;
  y.divisor = 4.0f;
  codec.decompress(msg.data(), bytes, plan, blk, y);
  return o;
}

// The first numel values of v as a bucket of dtype dt (float32 or bfloat16).
std::vector<uint8_t> bucket_bytes(const std::vector<float>& v, int64_t numel, DType dt) {
  std::vector<uint8_t> b(size_t(numel) * size_t(dtype_size(dt)));
  if (dt == DType::kF32) {
    std::memcpy(b.data(), v.data(), b.size());
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(b.data());
    for (int64_t i = 0; i < numel; ++i) h[i] = f32_to_bf16(v[size_t(i)]);
  }
  return b;
}

void expect_same_outputs(const Outputs& got, const Outputs& ref, const std::string& what) {
  EXPECT_TRUE(got.comp == ref.comp) << "compress " << what;
  EXPECT_TRUE(got.fused == ref.fused) << "fused " << what;
  ASSERT_EQ(got.acc.size(), ref.acc.size()) << what;
  EXPECT_EQ(0, std::memcmp(got.acc.data(), ref.acc.data(), ref.acc.size() * sizeof(float)))
      << "decompress_accumulate " << what;
  EXPECT_TRUE(got.dec == ref.dec) << "decompress " << what;
}

TEST(Parallel, DynamiqKernelsAreBitIdenticalWithThreads) {
  const DynamiqParams prm;
  const DynamiqCodec codec(prm);
  const int S = prm.fmt.S;
  const int64_t units = 1000;
  const int64_t numel = units * S - 77;  // a partial last unit
  std::mt19937_64 g(11);
  std::vector<uint8_t> bits(static_cast<size_t>(units));
  const uint8_t choices[] = {2, 4, 8, 2, 4, 16, 1};
  for (auto& b : bits) b = choices[g() % 7];
  std::vector<int32_t> order(static_cast<size_t>(units));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), g);
  std::vector<float> bias(static_cast<size_t>(units));
  for (auto& v : bias) v = float(int(g() % 200) - 100) * 1e-3f;
  const std::vector<float> xf = student_t3(size_t(numel), 5);
  const std::vector<float> yf = gaussian(size_t(numel), 6);

  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<uint8_t> bucket = bucket_bytes(xf, numel, dt);
    const Plan plan = make_dynamiq_plan(dt, numel, prm.fmt, bits, order, bias, 1);
    // whole bucket, and a block that starts and ends inside it
    for (const Block blk : {Block{0, units}, Block{123, 123 + 700}}) {
      for (int rounding = 0; rounding < 3; ++rounding) {
        RngCtx rng = rng_ctx(3, 9, /*rank=*/2, /*world=*/rounding == 2 ? 11 : 5, rounding != 0);
        // the "received" message: another rank's compression of y over the same block
        Local ly;
        ly.bucket = yf.data();
        const Plan pf = make_dynamiq_plan(DType::kF32, numel, prm.fmt, bits, order, bias, 1);
        std::vector<uint8_t> msg(codec.static_bytes(pf, blk));
        {
          ThreadScope one(1);
          codec.compress(ly, pf, blk, rng, msg.data());
        }
        Outputs ref;
        {
          ThreadScope one(1);
          ref = run_kernels(codec, plan, blk, bucket, msg, rng);
        }
        for (int threads : {2, 3}) {
          ThreadScope ts(threads);
          const Outputs got = run_kernels(codec, plan, blk, bucket, msg, rng);
          const std::string what = std::string(dt == DType::kF32 ? "fp32" : "bf16") + " block " +
                                   std::to_string(blk.w0) + " rounding " +
                                   std::to_string(rounding) + " threads " +
                                   std::to_string(threads);
          expect_same_outputs(got, ref, what);
        }
      }
    }
  }
}

// ---- every bitsplit kernel: the same, on its fixed-offset plans ---------------------

TEST(Parallel, BitsplitKernelsAreBitIdenticalWithThreads) {
  struct P {
    double bits;
    int group, spikes;
    bool log_scales;
  };
  // INT4 (group 32), INT3 with spikes (plane widths 2 + 1), INT8 (group 128), log scales
  const P ps[] = {{4, 0, -1, false}, {3, 0, -1, false}, {8, 0, -1, false}, {6, 64, 1, true}};
  const std::vector<float> yf = gaussian(size_t(400) * 1024, 8);
  for (const P& pp : ps) {
    const BitsplitCodec codec(resolve_bitsplit_params(pp.bits, pp.group, pp.spikes, pp.log_scales));
    const int64_t numel = 300 * int64_t(codec.unit()) - 45;  // a partial last unit and group
    const std::vector<float> xf = student_t3(size_t(numel), 7);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      // the message format depends on the dtype (kept min/max values): the
      // "received" message is another rank's compression of y in this dtype
      const std::vector<uint8_t> bucket = bucket_bytes(xf, numel, dt);
      const std::vector<uint8_t> ybucket = bucket_bytes(yf, numel, dt);
      const Plan plan = codec.make_plan(dt, numel, 1);
      for (const Block blk : {Block{0, plan.num_units}, Block{17, 17 + 200}}) {
        for (bool stochastic : {true, false}) {
          RngCtx rng = rng_ctx(4, 2, /*rank=*/1, /*world=*/4, false);
          rng.stochastic = stochastic;
          Local ly;
          ly.bucket = ybucket.data();
          std::vector<uint8_t> msg(codec.static_bytes(plan, blk));
          Outputs ref;
          {
            ThreadScope one(1);
            codec.compress(ly, plan, blk, rng, msg.data());
            ref = run_kernels(codec, plan, blk, bucket, msg, rng);
          }
          for (int threads : {2, 3}) {
            ThreadScope ts(threads);
            const Outputs got = run_kernels(codec, plan, blk, bucket, msg, rng);
            const std::string what = "bits " + std::to_string(pp.bits) + " " +
                                     (dt == DType::kF32 ? "fp32" : "bf16") + " block " +
                                     std::to_string(blk.w0) + " stochastic " +
                                     std::to_string(stochastic) + " threads " +
                                     std::to_string(threads);
            expect_same_outputs(got, ref, what);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dynamiq
