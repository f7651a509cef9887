// Splitting codec calls over CPU threads (csrc/kernels/base/parallel.h): the
// runs cover every unit once, a slow thread takes fewer runs, exceptions come
// back to the caller, the
// setting is validated, concurrent callers do not deadlock, and every DynamiQ,
// bitsplit and lossless kernel gives the same bytes / float bits with 1, 2 and
// 3 threads as the single-threaded call (blocks that do not start at wire
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

#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/lossless/lossless_codec.h"
#include "kernels/base/parallel.h"
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

// ---- every lossless kernel: the same, with messages of data-dependent size ---------------

// run_kernels for a codec whose messages have a dynamic part: output buffers
// of the largest message, cut to the returned sizes; `msg` is a whole message.
Outputs run_lossless_kernels(const LosslessCodec& codec, const Plan& plan, const Block& blk,
                             const std::vector<uint8_t>& bucket, const std::vector<uint8_t>& msg) {
  Outputs o;
  RngCtx rng;
  Local x;
  x.bucket = bucket.data();
  const size_t most = codec.max_message_bytes(plan, blk);
  o.comp.assign(most, 0);
  o.comp.resize(codec.compress(x, plan, blk, rng, o.comp.data()));
  o.fused.assign(most, 0);
  o.fused.resize(codec.decompress_accumulate_recompress(msg.data(), msg.size(), x, plan, blk, rng,
                                                        o.fused.data()));
  o.acc.assign(size_t(blk.units() * plan.unit), -1.0f);
  codec.decompress_accumulate(msg.data(), msg.size(), x, plan, blk, o.acc.data());
  o.dec.assign(bucket.size(), 0xAB);
  Output y;
  y.bucket = o.dec.data();
  y.divisor = 4.0f;
  codec.decompress(msg.data(), msg.size(), plan, blk, y);
  return o;
}

// numel values of dtype dt whose exponents make the encoder choose `want`
// (with the formats of the codec in the test).
std::vector<uint8_t> lossless_data(lossless::ExpFormat want, DType dt, int64_t numel, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> one(1.0f, 1.9f);  // one exponent (1.9: no rounding up to 2)
  const std::vector<float> gs = gaussian(size_t(numel), seed);
  std::vector<uint8_t> b(size_t(numel) * size_t(dtype_size(dt)));
  for (int64_t i = 0; i < numel; ++i) {
    uint32_t w;
    if (want == lossless::ExpFormat::kPlain) {
      w = uint32_t(g());  // random bits: uniform exponents
    } else {
      const float v = want == lossless::ExpFormat::kConst ? (g() & 1 ? -one(g) : one(g)) : gs[size_t(i)];
      w = dt == DType::kF32 ? f32_bits(v) : dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
    std::memcpy(b.data() + size_t(i) * size_t(dtype_size(dt)), &w, size_t(dtype_size(dt)));
  }
  return b;
}

// Segments are split over threads: zip escape offsets and Huffman stream
// offsets of later segments depend on every earlier one, and the parts'
// histograms are summed. Blocks of ~300 segments (several runs per thread),
// one ending in a partial segment and a tail, one not starting at 0.
TEST(Parallel, LosslessKernelsAreBitIdenticalWithThreads) {
  using lossless::ExpFormat;
  const int64_t numel = 300 * 1024 + 5;
  struct Case {
    ExpFormat want;
    uint32_t formats;  // LosslessOptions: zip never beats Huffman on this data, so it goes alone
  };
  const Case cases[] = {{ExpFormat::kPlain, 0xf},
                        {ExpFormat::kConst, 0xf},
                        {ExpFormat::kZip, 0x5},
                        {ExpFormat::kHuffman, 0xf}};
  for (const Case& c : cases) {
    LosslessOptions opt;
    opt.formats = c.formats;
    const LosslessCodec codec(opt);
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::vector<uint8_t> bucket = lossless_data(c.want, dt, numel, 21);
      const std::vector<uint8_t> ybucket = lossless_data(c.want, dt, numel, 22);
      const Plan plan = make_lossless_plan(dt, numel, 1);
      for (const Block blk : {Block{0, plan.num_units}, Block{37, plan.num_units}}) {
        const std::string what = std::string(lossless::exp_format_name(c.want)) + " " +
                                 dtype_name(dt) + " block " + std::to_string(blk.w0);
        // the "received" message: another rank's compression of y
        Local ly;
        ly.bucket = ybucket.data();
        std::vector<uint8_t> msg(codec.max_message_bytes(plan, blk));
        Outputs ref;
        {
          ThreadScope one(1);
          msg.resize(codec.compress(ly, plan, blk, RngCtx(), msg.data()));
          ref = run_lossless_kernels(codec, plan, blk, bucket, msg);
        }
        ASSERT_EQ(lossless_format_of(msg.data()), c.want) << what;
        ASSERT_EQ(lossless_format_of(ref.comp.data()), c.want) << what;
        for (int threads : {1, 2, 3}) {
          ThreadScope ts(threads);
          const Outputs got = run_lossless_kernels(codec, plan, blk, bucket, msg);
          expect_same_outputs(got, ref, what + " threads " + std::to_string(threads));
        }
      }
    }
  }
}

// A late segment's bad zip escape count or Huffman stream length is found by
// whichever thread decodes it, and reaches the caller as MalformedMessage.
TEST(Parallel, LosslessMalformedSegmentThrowsWithThreads) {
  using lossless::ExpFormat;
  const int64_t numel = 300 * 1024;
  const DType dt = DType::kBF16;
  const std::vector<uint8_t> bucket = lossless_data(ExpFormat::kHuffman, dt, numel, 23);
  const Plan plan = make_lossless_plan(dt, numel, 1);
  const Block blk{0, plan.num_units};
  const int64_t S = 300;
  const size_t sb = lossless_static_bytes(dt, numel);
  ThreadScope ts(2);
  for (uint32_t formats : {0x5u, 0x9u}) {
    LosslessOptions opt;
    opt.formats = formats;
    const LosslessCodec codec(opt);
    Local x;
    x.bucket = bucket.data();
    std::vector<uint8_t> msg(codec.max_message_bytes(plan, blk));
    msg.resize(codec.compress(x, plan, blk, RngCtx(), msg.data()));
    const bool zip = lossless_format_of(msg.data()) == ExpFormat::kZip;
    ASSERT_EQ(lossless_format_of(msg.data()), formats == 0x5u ? ExpFormat::kZip : ExpFormat::kHuffman);
    // The u16 table of per-segment escape counts (zip: after the 8-byte code
    // table) or stream bytes (Huffman: after k - 1, k symbols, k lengths).
    size_t table = sb + 8;
    if (!zip) {
      const int k = int(msg[sb]) + 1;
      table = sb + size_t(1 + k + (k + 1) / 2);
    }
    for (int64_t s : {S - 40, S - 2}) {
      // One escape / stream byte moved from segment s to s + 1: the table
      // still adds up (parsing passes), segment s does not decode.
      std::vector<uint8_t> bad(msg);
      uint16_t a, b;
      std::memcpy(&a, bad.data() + table + 2 * size_t(s), 2);
      std::memcpy(&b, bad.data() + table + 2 * size_t(s) + 2, 2);
      ASSERT_GT(a, 0);
      --a, ++b;
      std::memcpy(bad.data() + table + 2 * size_t(s), &a, 2);
      std::memcpy(bad.data() + table + 2 * size_t(s) + 2, &b, 2);
      const std::string what = std::string(zip ? "zip" : "huffman") + " segment " + std::to_string(s);
      std::vector<uint8_t> out(codec.max_message_bytes(plan, blk));
      std::vector<float> acc(size_t(blk.units() * plan.unit));
      std::vector<uint8_t> dec(bucket.size());
      Output y;
      y.bucket = dec.data();
      EXPECT_THROW(codec.decompress(bad.data(), bad.size(), plan, blk, y), MalformedMessage) << what;
      EXPECT_THROW(codec.decompress_accumulate(bad.data(), bad.size(), x, plan, blk, acc.data()),
                   MalformedMessage)
          << what;
      EXPECT_THROW(codec.decompress_accumulate_recompress(bad.data(), bad.size(), x, plan, blk,
                                                          RngCtx(), out.data()),
                   MalformedMessage)
          << what;
    }
    // and the intact message still decodes
    std::vector<uint8_t> dec(bucket.size());
    Output y;
    y.bucket = dec.data();
    codec.decompress(msg.data(), msg.size(), plan, blk, y);
    EXPECT_TRUE(dec == bucket);
  }
}

}  // namespace
}  // namespace dynamiq
