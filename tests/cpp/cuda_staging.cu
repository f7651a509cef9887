// Device buffers over a host-only transport (StagingTransport: device ->
// page-locked host -> transport -> host -> device, hook/transport/staging_transport.h),
// as CUDA tensors run over a Gloo group: the in-process transport here carries
// host memory only, with Gloo's rules (rendezvous sends, receives completed by
// shorter messages). The whole driver runs with the buckets on the device, each
// rank on a non-blocking stream of its own; results, paths and byte counts
// must equal the host run bit for bit. On the CUDA emulation streams are
// queues that run only when the host waits (tests/cpp/cuda_emu/cuda_runtime.h),
// so a staged send posted before its device -> host copy completed, or a
// staging buffer reused before its host -> device copy ran, sends or delivers
// stale bytes and fails the comparison. With nvcc it runs on a GPU and skips
// without one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "hook/transport/staging_transport.h"
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/float_bits.h"
#include "kernels/registry.h"
#include "test_dynamiq_util.h"
#include "params_util.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<std::vector<uint8_t>> staged_input(int n, DType dt, int64_t numel) {
  return dqtest::shifted_gaussian_buckets(n, dt, numel, 300);
}

// Counts the messages a rank sends through it (non-empty ones).
class CountingTransport final : public Transport {
 public:
  explicit CountingTransport(Transport& t) : t_(t) {}
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override {
    return t_.irecv(buf, bytes, src, tag);
  }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override {
    if (bytes) ++sends;
    return t_.isend(buf, bytes, dst, tag);
  }
  void group_start() override { t_.group_start(); }
  void group_end() override { t_.group_end(); }
  bool posts_in_order() const override { return t_.posts_in_order(); }
  bool accepts_shorter_messages() const override { return t_.accepts_shorter_messages(); }
  void allreduce_sum_i64(int64_t* data, size_t count) override { t_.allreduce_sum_i64(data, count); }
  int64_t sends = 0;

 private:
  Transport& t_;
};

struct StagedRun {
  std::vector<std::vector<uint8_t>> out;    // every rank's bucket after the last collective
  std::vector<CallStats> stats;             // every rank's stats of the last collective
  std::vector<StagingPool::Stats> pool;     // every rank's staging pool after each collective (rank-major)
  std::vector<int64_t> sends;               // every rank's messages sent, all collectives (staged runs)
};

// `reps` collectives one after the other on the same buckets (in place: each
// all-reduces the previous result), seq 1, 2, ...; staged: buckets on the
// device, staged through host memory.
StagedRun run_collectives(const CollectiveConfig& cfg, const std::vector<std::vector<uint8_t>>& input, DType dt, int64_t numel,
        bool staged, int reps) {
  const int n = int(input.size());
  StagedRun res;
  res.out = input;
  res.stats.resize(size_t(n));
  res.pool.resize(size_t(n) * size_t(reps));
  res.sends.assign(size_t(n), 0);
  InprocWorld world(n, std::chrono::seconds(120));  // host memory only
  world.set_rendezvous_sends(true);                 // as Gloo
  world.set_accepts_shorter_messages(true);
  world.run([&](int r, Transport& world_tr) {
    CountingTransport host_tr(world_tr);
    auto& x = res.out[size_t(r)];
    if (!staged) {
      for (int k = 0; k < reps; ++k) {
        CallArgs a;
        a.data = x.data();
        a.dtype = dt;
        a.numel = numel;
        a.seq = uint64_t(k + 1);
        res.stats[size_t(r)] = all_reduce(host_tr, cfg, a);
      }
      return;
    }
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, x.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
    {
      cuda::StreamScope scope(st);
      StagingPool pool(*cuda::device().staging());
      for (int k = 0; k < reps; ++k) {
        StagingTransport tr(host_tr, pool);  // one per collective, as the torch binding makes it
        CallArgs a;
        a.data = d;
        a.dtype = dt;
        a.numel = numel;
        a.seq = uint64_t(k + 1);
        a.device = &cuda::device();
        res.stats[size_t(r)] = all_reduce(tr, cfg, a);
        res.pool[size_t(r) * size_t(reps) + size_t(k)] = pool.stats();
      }
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      release_device_codecs(st);
    }
    res.sends[size_t(r)] = host_tr.sends;
    ASSERT_EQ(cudaMemcpy(x.data(), d, x.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d);
    cudaStreamDestroy(st);
  });
  return res;
}

// Every mode, ring, butterfly and two-step with 3 ranks, the ring with 2,
// fp32 and (ring) bf16, a bucket with an inf (the lossy modes' exact path),
// two collectives in a row (the second reuses the first's staging buffers).
TEST(CudaStaging, EveryModeOverAHostTransportEqualsTheHostRun) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t numel = 256 * 40 + 5;
  for (Mode mode : {kModeNone, mode_id("dynamiq"), mode_id("bitsplit"), mode_id("lossless")})
    for (Topology topo : schedule_topologies())
      for (int n : {2, 3})
        for (DType dt : {DType::kF32, DType::kBF16})
          for (bool inf : {false, true}) {
            // (n = 2 and bf16 on the ring only; an inf on lossy modes, whose exact fallback it takes)
            if ((n == 2 || dt == DType::kBF16) && topo != kTopologyRing) continue;
            if (inf && (dt == DType::kBF16 || mode == kModeNone || mode == mode_id("lossless"))) continue;
            SCOPED_TRACE(std::string(mode_name(mode)) + " " + topology_name(topo) + " n=" + std::to_string(n) + " " +
                         dtype_name(dt) + (inf ? " with an inf" : ""));
            CollectiveConfig cfg;
            cfg.mode = mode;
            cfg.topology = topo;
            set_if_declared(mode, cfg.params, "bits", num_value(mode == mode_id("bitsplit") ? 3.0 : 5.0));
            cfg.block_bytes = 4096;  // several blocks per chunk
            auto input = staged_input(n, dt, numel);
            if (inf) {
              const float v = std::numeric_limits<float>::infinity();
              std::memcpy(input[1].data() + 4 * 77, &v, 4);
            }
            const StagedRun host = run_collectives(cfg, input, dt, numel, false, 2);
            const StagedRun dev = run_collectives(cfg, input, dt, numel, true, 2);
            EXPECT_EQ(host.stats[0].path, inf                  ? Path::kExactNonfinite
                                          : mode == kModeNone ? Path::kExactMode
                                                              : Path::kCompressed);
            for (int r = 0; r < n; ++r) {
              EXPECT_EQ(dev.out[size_t(r)], host.out[size_t(r)]) << "rank " << r;
              EXPECT_EQ(dev.stats[size_t(r)].path, host.stats[size_t(r)].path) << "rank " << r;
              EXPECT_EQ(dev.stats[size_t(r)].bytes_sent, host.stats[size_t(r)].bytes_sent) << "rank " << r;
              EXPECT_EQ(dev.stats[size_t(r)].messages_sent, host.stats[size_t(r)].messages_sent) << "rank " << r;
              EXPECT_EQ(dev.stats[size_t(r)].meta_bytes_sent, host.stats[size_t(r)].meta_bytes_sent) << "rank " << r;
            }
          }
}

// The staging pool: the second collective of the same size takes its buffers
// from the first's, and every sent message costs exactly one host wait.
TEST(CudaStaging, TheSecondCollectiveReusesTheStagingBuffers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int n = 3, reps = 3;
  const int64_t numel = 256 * 64;
  for (Mode mode : {kModeNone, mode_id("dynamiq"), mode_id("lossless")}) {
    SCOPED_TRACE(mode_name(mode));
    CollectiveConfig cfg;
    cfg.mode = mode;
    cfg.block_bytes = 8192;
    const auto input = staged_input(n, DType::kF32, numel);
    const StagedRun dev = run_collectives(cfg, input, DType::kF32, numel, true, reps);
    const StagedRun host = run_collectives(cfg, input, DType::kF32, numel, false, reps);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(dev.out[size_t(r)], host.out[size_t(r)]) << "rank " << r;
      const StagingPool::Stats* p = &dev.pool[size_t(r) * reps];
      EXPECT_GT(p[0].allocations, 0) << "rank " << r;
      EXPECT_GT(p[reps - 1].reuses, p[0].reuses) << "rank " << r;
      // later collectives allocate at most what the first one's buffers still
      // busy with a copy force (one message in flight per direction)
      EXPECT_LE(p[reps - 1].allocations - p[0].allocations, 2) << "rank " << r;
      // one host wait per message sent (data, metadata, exact paths), none per receive
      EXPECT_EQ(p[reps - 1].host_waits, dev.sends[size_t(r)]) << "rank " << r;
      EXPECT_GT(dev.sends[size_t(r)], 0) << "rank " << r;
    }
  }
}

#if defined(DYNAMIQ_CUDA_EMULATION)
// Host waits per collective, counted on the emulation (every
// cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize and
// blocking cudaMemcpy a rank's thread makes), with the buckets on the device
// staged over a host transport. The staging transport waits once per message
// it sends (counted by its pool); everything else must not grow with the
// number of blocks (no wait after each kernel): the same collective cut
// into 4x more blocks makes (up to a buffer pool's trim) as many other waits,
// at most 4 per rank. Lossless still waits inside its codec calls (sizes
// known on the host), so it has a per-message budget instead. Measured at the
// time of writing (3 ranks, all ranks' waits, coarse/fine blocks): none 0/0,
// dynamiq 9/11, bitsplit 6/6, lossless 120/480 for 24/96 messages.
struct Waits {
  int64_t other = 0;       // waits the staging transport did not make, all ranks
  int64_t staging = 0;     // the staging transport's, all ranks
  int64_t codec_calls = 0; // the data executor's messages sent, all ranks
};

Waits count_waits(const CollectiveConfig& cfg, int n, int64_t numel) {
  const auto input = staged_input(n, DType::kF32, numel);
  Waits w;
  std::vector<StagingPool::Stats> pool(static_cast<size_t>(n));
  std::vector<int64_t> msgs(static_cast<size_t>(n));
  std::vector<std::thread::id> ids(static_cast<size_t>(n));
  std::vector<void*> d(static_cast<size_t>(n));
  std::vector<cudaStream_t> st(static_cast<size_t>(n));
  std::vector<std::unique_ptr<StagingPool>> pools(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(cudaMalloc(&d[size_t(r)], input[size_t(r)].size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d[size_t(r)], input[size_t(r)].data(), input[size_t(r)].size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&st[size_t(r)], cudaStreamNonBlocking), cudaSuccess);
  }
  dynamiq_cuda_emu::set_api_log(true);
  {
    InprocWorld world(n, std::chrono::seconds(120));
    world.set_rendezvous_sends(true);
    world.set_accepts_shorter_messages(true);
    world.run([&](int r, Transport& host_tr) {
      ids[size_t(r)] = std::this_thread::get_id();
      cuda::StreamScope scope(st[size_t(r)]);
      pools[size_t(r)] = std::make_unique<StagingPool>(*cuda::device().staging());
      StagingPool& p = *pools[size_t(r)];  // (destroyed after the count: its teardown waits are not the collective's)
      StagingTransport tr(host_tr, p);
      CallArgs a;
      a.data = d[size_t(r)];
      a.numel = numel;
      a.seq = 9;
      a.device = &cuda::device();
      msgs[size_t(r)] = all_reduce(tr, cfg, a).messages_sent;
      pool[size_t(r)] = p.stats();
      release_device_codecs(st[size_t(r)]);
      // the executor's buffers are freed when this thread ends, on no stream of ours: the
      // work queued on ours must be done by then (the Python worker waits for its streams
      // the same way before it ends); this wait is the test's, subtracted below
      EXPECT_EQ(cudaStreamSynchronize(st[size_t(r)]), cudaSuccess);
    });
  }
  const auto log = dynamiq_cuda_emu::api_log();
  dynamiq_cuda_emu::set_api_log(false);
  for (const auto& c : log) {
    const std::string name = c.name;
    if (std::find(ids.begin(), ids.end(), c.thread) == ids.end()) continue;
    if (name == "cudaStreamSynchronize" || name == "cudaEventSynchronize" || name == "cudaDeviceSynchronize" ||
        name == "cudaMemcpy")
      ++w.other;
  }
  pools.clear();
  for (int r = 0; r < n; ++r) {
    w.staging += pool[size_t(r)].host_waits;
    w.codec_calls += msgs[size_t(r)];
    cudaFree(d[size_t(r)]);
    cudaStreamDestroy(st[size_t(r)]);
  }
  w.other -= w.staging + n;
  return w;
}

TEST(CudaStaging, HostWaitsPerCollectiveDoNotGrowWithTheBlocks) {
  const int n = 3;
  const int64_t numel = 256 * 96;
  for (Mode mode : {kModeNone, mode_id("dynamiq"), mode_id("bitsplit"), mode_id("lossless")}) {
    SCOPED_TRACE(mode_name(mode));
    CollectiveConfig cfg;
    cfg.mode = mode;
    cfg.min_compress_numel = 0;
    cfg.block_bytes = 16384;
    const Waits coarse = count_waits(cfg, n, numel);
    cfg.block_bytes = 4096;
    const Waits fine = count_waits(cfg, n, numel);
    EXPECT_GE(fine.codec_calls, 2 * coarse.codec_calls) << "the finer blocks did not make more messages";
    for (const Waits* w : {&coarse, &fine}) {
      const char* which = w == &coarse ? "coarse blocks" : "fine blocks";
      if (mode == mode_id("lossless")) {
        // per sent message: the encode's histogram and section size, the receiver's read of
        // its header; the decodes wait for nothing (their refusals: once, in finish())
        EXPECT_LE(w->other, 3 * w->codec_calls + 5 * n) << which;
        std::printf("lossless, %s: %lld waits beside staging, %lld messages\n", which, (long long)w->other,
                    (long long)w->codec_calls);
      } else {
        // local pass, the statistics' staging through device memory, bitsplit's
        // deferred flag, a buffer pool's trim: at most 4 per rank, whatever the blocks
        EXPECT_LE(w->other, 4 * n) << which;
      }
    }
    if (mode != mode_id("lossless")) EXPECT_LE(fine.other, coarse.other + n);
  }
}
#endif

}  // namespace
}  // namespace dynamiq
