// The host side of the CUDA codecs (issue 41, item 1): what a call costs the
// host must not grow with the bucket, and a collective must not make more
// host waits or device-to-host copies than it did. Both on the CUDA emulation
// only (tests/cpp/cuda_emu): it queues kernels on a stream until a wait, so
// the time of a call is its host side, and it logs every runtime call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/bitsplit/cuda/bitsplit_cuda_codec.h"
#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"
#include "kernels/identity/cuda/identity_cuda_codec.h"
#include "params_util.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

#if defined(DYNAMIQ_CUDA_EMULATION)

using Clock = std::chrono::steady_clock;

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Launches queued but never run while in scope (the emulated kernels of a
// 64 MiB bucket would take minutes; the host side is what is timed).
struct SkipKernels {
  SkipKernels() { prev = dynamiq_cuda_emu::set_skip_kernels(true); }
  ~SkipKernels() { dynamiq_cuda_emu::set_skip_kernels(prev); }
  bool prev;
};

// A DynamiQ plan as the scheme makes one: mixed widths, wire order sorted by
// width, a bias per super-group, 4 chunks.
Plan dynamiq_test_plan(int64_t numel, const DynamiqFormat& f) {
  const int64_t units = ceil_div<int64_t>(numel, f.S);
  std::vector<uint8_t> bits(static_cast<size_t>(units));
  std::vector<float> bias(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u) {
    bits[size_t(u)] = uint8_t(kDynamiqWidths[(u * 7) % 5]);
    bias[size_t(u)] = 0.01f * float(u % 13);
  }
  std::vector<int32_t> order(static_cast<size_t>(units));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bits[size_t(a)] < bits[size_t(b)]; });
  return make_dynamiq_plan(DType::kF32, numel, f, bits, order, bias, 4);
}

// One bucket on the device, its plan, and a codec of its own (each size its
// own, as each bucket of a model has its own plan) called on the bucket's
// first chunk (a quarter of it: the block grows with the bucket, as the
// executor's blocks of a bigger bucket may).
struct Case {
  std::unique_ptr<Codec> codec;
  Plan plan;
  Block blk;
  void* bucket = nullptr;
  uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  size_t bytes = 0;
  RngCtx rng;

  Case(std::unique_ptr<Codec> c, Plan p) : codec(std::move(c)), plan(std::move(p)) {
    blk = Block{plan.chunk_begin[0], plan.chunk_begin[1]};
    bytes = codec->static_bytes(plan, blk);
    EXPECT_EQ(cudaMalloc(&bucket, size_t(plan.numel) * dtype_size(plan.dtype)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), bytes), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), bytes), cudaSuccess);
    rng.key = make_rng_key(3, 4);
    rng.rank = 1;
    rng.world = 4;
  }
  ~Case() {
    cudaFree(bucket);
    cudaFree(in);
    cudaFree(out);
  }
  // Seconds of host time of call `op` (0 compress, 1 fused hop, 2 decompress) on `p`.
  double time(int op, const Plan& p) const {
    Local x;
    x.bucket = bucket;
    Output y;
    y.bucket = bucket;
    y.bias_scale = 4.0f;
    const auto t0 = Clock::now();
    if (op == 0) codec->compress(x, p, blk, rng, out);
    if (op == 1) codec->decompress_accumulate_recompress(in, bytes, x, p, blk, rng, out);
    if (op == 2) codec->decompress(in, bytes, p, blk, y);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

const char* const kOps[3] = {"compress", "fused hop", "decompress"};

// Host time per call of compress, the fused hop and decompress on a 64 MiB
// fp32 bucket against a 1 MiB one (the block: a quarter of the bucket): at
// most 2x (a call must do no host work that grows with the bucket or the
// block). Medians of calls interleaved between the two sizes (a loaded
// machine slows both alike). Before issue 41's change, DynamiQ's calls
// compared the whole plan with the cached one and checked every unit of the
// block: 64 MiB calls took 30-60x the 1 MiB ones (130-210 against 2.4-4.5
// us per call on the 2-core machine, loaded). Also printed, not checked:
// the first call with a new plan (its one check and upload, O(plan)).
TEST(CudaHostCost, CallHostTimeDoesNotGrowWithTheBucket) {
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  const int64_t small = int64_t(1) << 18, large = int64_t(1) << 24;  // fp32: 1 MiB, 64 MiB
  const int reps = 21;
  {
    SkipKernels skip;
    const DynamiqParams dprm;
    const BitsplitParams bprm{3, 32, true, false};
    const BitsplitCodec bs_host(bprm);
    struct Named {
      const char* name;
      std::function<Plan(int64_t)> plan;
      std::function<std::unique_ptr<Codec>()> codec;
    };
    const std::vector<Named> codecs = {
        {"dynamiq", [&](int64_t n) { return dynamiq_test_plan(n, dprm.fmt); },
         [&] { return std::make_unique<cuda::DynamiqCudaCodec>(dprm, st); }},
        {"bitsplit", [&](int64_t n) { return bs_host.make_plan(DType::kF32, n, 4); },
         [&] { return std::make_unique<cuda::BitsplitCudaCodec>(bprm, st); }},
        {"none", [&](int64_t n) { return make_identity_plan(DType::kF32, n, 4); },
         [&] { return std::make_unique<cuda::IdentityCudaCodec>(st); }},
    };
    for (const Named& nc : codecs) {
      SCOPED_TRACE(nc.name);
      Case cs(nc.codec(), nc.plan(small)), cl(nc.codec(), nc.plan(large));
      // first calls with a new plan (a copy: a new generation): the thread's CPU
      // time, least of 7 (a loaded machine preempts some), then repeated calls
      double first[2] = {1e30, 1e30};
      for (int i = 0; i < 7; ++i)
        for (Case* c : {&cs, &cl}) {
          const Plan fresh = c->plan;
          const double t0 = thread_cpu_seconds();
          c->time(0, fresh);
          first[c == &cl] = std::min(first[c == &cl], thread_cpu_seconds() - t0);
        }
      std::vector<double> t[3][2];
      for (int i = 0; i < reps; ++i)
        for (int op = 0; op < 3; ++op)
          for (Case* c : {&cs, &cl}) t[op][c == &cl].push_back(c->time(op, c->plan));
      std::printf("%-8s host us per call, 1 MiB / 64 MiB bucket: first call with a new plan %.1f / %.1f",
                  nc.name, 1e6 * first[0], 1e6 * first[1]);
      for (int op = 0; op < 3; ++op)
        std::printf("; %s %.2f / %.2f", kOps[op], 1e6 * median(t[op][0]), 1e6 * median(t[op][1]));
      std::printf("\n");
      for (int op = 0; op < 3; ++op)
        EXPECT_LE(median(t[op][1]), 2.0 * median(t[op][0]))
            << kOps[op] << ": a 64 MiB bucket's call costs the host more than twice a 1 MiB one's";
      EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);  // (the queued work: copies, skipped kernels)
    }
  }
  EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  cudaStreamDestroy(st);
}


// The device memory, counting the in-process transport's staging copies
// through the host (each one device-to-host or host-to-device copy and one
// wait): they stand in for NCCL's device-to-device messages, which make none.
class CountingMemory final : public Memory {
 public:
  std::string name() const override { return m().name(); }
  void* allocate(size_t bytes) const override { return m().allocate(bytes); }
  void release(void* p) const override { m().release(p); }
  void trim() const override { m().trim(); }
  int domain() const override { return m().domain(); }
  void to_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) ++to_host_copies;
    m().to_host(dst, src, bytes);
  }
  void from_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) ++from_host_copies;
    m().from_host(dst, src, bytes);
  }
  mutable std::atomic<long long> to_host_copies{0}, from_host_copies{0};

 private:
  static const Memory& m() { return cuda::device_memory(); }
};

// Every rank thread waits here until all have arrived; the last one runs `fn` first.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait(const std::function<void()>& fn = nullptr) {
    std::unique_lock<std::mutex> lk(mu_);
    const long long round = round_;
    if (++arrived_ == n_) {
      if (fn) fn();
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return round_ != round; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  long long round_ = 0;
};

struct HostSync {
  long long waits = 0;  // cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, blocking cudaMemcpy
  long long d2h = 0;    // device-to-host copies
};

// A collective's host waits and device-to-host copies over all ranks, less
// the in-process transport's staging (CountingMemory). [0]: the first
// collective on new streams (the device codecs made, their tables uploaded);
// [1]: the next one, a new bucket's values and so a new plan, on the codecs
// the first one left in the cache.
std::vector<HostSync> count_host_sync(const CollectiveConfig& cfg, int n, int64_t numel) {
  const auto input = dqtest::shifted_gaussian_buckets(n, DType::kF32, 2 * numel, 500);
  std::vector<void*> d(static_cast<size_t>(n));
  std::vector<cudaStream_t> st(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(cudaMalloc(&d[size_t(r)], input[size_t(r)].size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d[size_t(r)], input[size_t(r)].data(), input[size_t(r)].size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&st[size_t(r)], cudaStreamNonBlocking), cudaSuccess);
  }
  std::vector<std::thread::id> ids(static_cast<size_t>(n));
  const CountingMemory mem;
  std::vector<HostSync> out(2);
  std::vector<dynamiq_cuda_emu::ApiCall> log;
  long long staged = 0, staged_d2h = 0;
  Barrier barrier(n);
  auto start = [&] {
    dynamiq_cuda_emu::set_api_log(true);
    dynamiq_cuda_emu::reset_copy_counts();
    mem.to_host_copies = 0;
    mem.from_host_copies = 0;
  };
  auto stop = [&](HostSync& hs) {
    log = dynamiq_cuda_emu::api_log();
    dynamiq_cuda_emu::set_api_log(false);
    for (const auto& c : log) {
      if (std::find(ids.begin(), ids.end(), c.thread) == ids.end()) continue;
      const std::string name = c.name;
      if (name == "cudaStreamSynchronize" || name == "cudaEventSynchronize" || name == "cudaDeviceSynchronize" ||
          name == "cudaMemcpy")
        ++hs.waits;
    }
    hs.d2h = (long long)dynamiq_cuda_emu::copy_counts().d2h_copies;
    staged = mem.to_host_copies + mem.from_host_copies;
    staged_d2h = mem.to_host_copies;
    hs.waits -= staged;
    hs.d2h -= staged_d2h;
  };
  clear_device_codecs();
  {
    InprocWorld world(n, std::chrono::seconds(120), &mem);
    world.run([&](int r, Transport& tr) {
      ids[size_t(r)] = std::this_thread::get_id();
      cuda::StreamScope scope(st[size_t(r)]);
      for (int k = 0; k < 2; ++k) {
        barrier.wait(start);
        CallArgs a;
        a.data = static_cast<float*>(d[size_t(r)]) + k * numel;  // another bucket: another plan
        a.numel = numel;
        a.seq = uint64_t(20 + k);
        a.device = &cuda::device();
        all_reduce(tr, cfg, a);
        barrier.wait([&] { stop(out[size_t(k)]); });
      }
      release_device_codecs(st[size_t(r)]);
      // the executor's buffers are freed when this thread ends, on no stream of ours
      EXPECT_EQ(cudaStreamSynchronize(st[size_t(r)]), cudaSuccess);
    });
  }
  for (int r = 0; r < n; ++r) {
    cudaFree(d[size_t(r)]);
    cudaStreamDestroy(st[size_t(r)]);
  }
  return out;
}

// Host waits and device-to-host copies of a compressed all-reduce on the
// emulated device (3 ranks, ring, 96 super-groups, 4 KiB blocks), the
// transport's staging aside, in each compressed mode: at most what they were
// before issue 41's change to the codecs' host side, recorded then with this
// test (waits / copies, first collective; next one): dynamiq 10 / 9; 13 / 9
// (the next plan's upload waited for the last one's copy, once per rank),
// bitsplit 6 / 6; 6 / 6, lossless 243 / 291; 243 / 291.
TEST(CudaHostCost, HostWaitsAndCopiesPerCollectiveDoNotGrow) {
  const int n = 3;
  const int64_t numel = 256 * 96;
  struct Budget {
    const char* mode;
    HostSync first, next;
  };
  const Budget budgets[] = {
      {"dynamiq", {10, 9}, {13, 9}},
      {"bitsplit", {6, 6}, {6, 6}},
      {"lossless", {243, 291}, {243, 291}},
  };
  for (const Budget& b : budgets) {
    SCOPED_TRACE(b.mode);
    CollectiveConfig cfg;
    cfg.mode = mode_id(b.mode);
    set_if_declared(cfg.mode, cfg.params, "bits", num_value(cfg.mode == mode_id("bitsplit") ? 3.0 : 5.0));
    cfg.min_compress_numel = 0;
    cfg.block_bytes = 4096;
    const std::vector<HostSync> got = count_host_sync(cfg, n, numel);
    std::printf("%-8s host waits / device-to-host copies, all ranks: first collective %lld / %lld, next %lld / %lld\n",
                b.mode, got[0].waits, got[0].d2h, got[1].waits, got[1].d2h);
    EXPECT_LE(got[0].waits, b.first.waits);
    EXPECT_LE(got[0].d2h, b.first.d2h);
    EXPECT_LE(got[1].waits, b.next.waits);
    EXPECT_LE(got[1].d2h, b.next.d2h);
    EXPECT_GT(got[1].waits, 0);  // (not a vacuous count)
  }
}

#endif  // DYNAMIQ_CUDA_EMULATION

}  // namespace
}  // namespace dynamiq
