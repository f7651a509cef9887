// The all-reduce with the CUDA codecs (Dynamiq-, Bitsplit-, Identity-, LosslessCudaCodec) in
// place of the CPU ones, under the real executor and schedules over the
// in-process transport: every topology, worlds 2, 3, 5 and 9, fp32 and bf16,
// sum and mean, several blocks per chunk. Every rank's result and every byte
// count must equal the CPU codec's run. The GPU run keeps the buckets, the
// executor's buffers and accumulator in device memory (cuda::device_memory) and
// stages messages between the rank threads through the host. With nvcc it runs
// on a GPU (one device shared by all ranks) and skips without one; CI runs it
// on the CPU emulation of CUDA (tests/cpp/cuda_emu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/executor.h"
#include "hook/transport/inproc_transport.h"
#include "hook/collective/schedule.h"
#include "kernels/bitsplit/cuda/bitsplit_cuda_codec.h"
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"
#include "kernels/identity/cuda/identity_cuda_codec.h"
#include "kernels/lossless/cuda/lossless_cuda_codec.h"
#include "kernels/lossless/lossless_codec.h"
#include "test_dynamiq_util.h"
#include "params_util.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct RankResult {
  std::vector<uint8_t> bucket;
  ExecStats st;
};

// One in-process all-reduce; codec_for(r) is rank r's codec, alloc/copy move
// the bucket to and from where that codec works.
template <typename CodecFor>
std::vector<RankResult> run(Topology topo, int n, DType dt, bool mean, const Plan& plan,
                            const std::vector<std::vector<uint8_t>>& input, CodecFor codec_for, bool device) {
  const BlockTable bt = make_blocks(plan, 1500);  // several blocks per chunk
  std::vector<RankResult> out(static_cast<size_t>(n));
  // on the device: the executor's buffers in device memory, messages staged
  // through the host (the emulator checks both copies touch device allocations)
  InprocWorld world(n, std::chrono::seconds(120), device ? &cuda::device_memory() : nullptr);
  world.run([&](int r, Transport& tr) {
    const std::vector<uint8_t>& x = input[size_t(r)];
    void* data = nullptr;
    std::vector<uint8_t> host = x;
    if (device) {
      EXPECT_EQ(cudaMalloc(&data, x.size()), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(data, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      data = host.data();
    }
    const Program prog = make_program(topo, r, n, bt);
    ExecArgs ea;
    ea.bucket = data;
    ea.out.bucket = data;
    ea.out.bias_scale = float(n);
    ea.out.divisor = mean ? float(n) : 1.0f;
    ea.rng.key = make_rng_key(11, 17);
    ea.rng.rank = r;
    ea.rng.world = n;
    ea.rng.correlated = true;
    ea.memory = device ? &cuda::device_memory() : nullptr;
    RankResult& res = out[size_t(r)];
    execute(tr, codec_for(r), plan, bt, prog, ea, res.st);
    if (device) {
      EXPECT_EQ(cudaMemcpy(host.data(), data, x.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      cudaFree(data);
    }
    res.bucket = host;
  });
  return out;
}

std::vector<std::vector<uint8_t>> make_input(int n, DType dt, int64_t numel) {
  return dqtest::shifted_gaussian_buckets(n, dt, numel, 100);
}

void expect_same(const std::vector<RankResult>& got, const std::vector<RankResult>& want,
                 const std::vector<uint8_t>& input0) {
  for (size_t r = 0; r < got.size(); ++r) {
    EXPECT_EQ(got[r].bucket, want[r].bucket) << "rank " << r;
    EXPECT_EQ(got[r].st.bytes_sent, want[r].st.bytes_sent) << "rank " << r;
    EXPECT_EQ(got[r].st.bytes_received, want[r].st.bytes_received) << "rank " << r;
    EXPECT_EQ(got[r].bucket, got[0].bucket) << "rank " << r << " differs from rank 0";
  }
  EXPECT_NE(got[0].bucket, input0) << "the all-reduce changed nothing";
}

TEST(CudaCollective, DynamiqSameResultsAndBytesAsTheCpuCodecOnEveryRank) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DynamiqParams prm;
  const DynamiqFormat f = prm.fmt;
  const int64_t numel = 256 * 29 + 51;
  const int64_t units = ceil_div<int64_t>(numel, f.S);
  // rank codecs kept across configurations: each must notice the new plan
  std::map<int, std::vector<std::unique_ptr<cuda::DynamiqCudaCodec>>> gpu;
  for (Topology topo : schedule_topologies())
    for (int n : {2, 3, 5, 9})
      for (DType dt : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(std::string(topology_name(topo)) + " n=" + std::to_string(n) + " " + dtype_name(dt));
        const bool mean = n % 2 == 1;
        const auto input = make_input(n, dt, numel);
        // mixed widths grouped by width, a per-SG bias; a different plan in
        // every configuration (the codecs are reused and must re-upload it)
        const int64_t shift = int64_t(topo) * 2 + int64_t(dt);
        std::vector<uint8_t> bits(static_cast<size_t>(units));
        std::vector<float> bias(static_cast<size_t>(units));
        for (int64_t u = 0; u < units; ++u) {
          bits[size_t(u)] = uint8_t(kDynamiqWidths[(u * 3 + shift) % 5]);
          bias[size_t(u)] = 0.25f + 0.01f * float((u + shift) % 7);
        }
        std::vector<int32_t> order(static_cast<size_t>(units));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return bits[size_t(a)] < bits[size_t(b)]; });
        const Plan plan = make_dynamiq_plan(dt, numel, f, bits, order, bias, topology_chunks(topo, n));

        const DynamiqCodec cpu(prm);
        const auto want = run(topo, n, dt, mean, plan, input, [&](int) -> const Codec& { return cpu; }, false);
        auto& codecs = gpu[n];
        for (int r = int(codecs.size()); r < n; ++r) codecs.push_back(std::make_unique<cuda::DynamiqCudaCodec>(prm));
        const auto got =
            run(topo, n, dt, mean, plan, input, [&](int r) -> const Codec& { return *codecs[size_t(r)]; }, true);
        expect_same(got, want, input[0]);
      }
}

TEST(CudaCollective, BitsplitSameResultsAndBytesAsTheCpuCodecOnEveryRank) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t numel = 1024 * 9 + 77;  // a partial last group and unit
  std::map<int, std::vector<std::unique_ptr<cuda::BitsplitCudaCodec>>> gpu;
  for (const BitsplitParams& prm : {BitsplitParams{2, 32, true, false}, BitsplitParams{5, 128, false, true}}) {
    gpu.clear();
    const BitsplitCodec cpu(prm);
    for (Topology topo : schedule_topologies())
      for (int n : {2, 3, 5})
        for (DType dt : {DType::kF32, DType::kBF16}) {
          SCOPED_TRACE("bits " + std::to_string(prm.bits) + " " + topology_name(topo) + " n=" + std::to_string(n) +
                       " " + dtype_name(dt));
          const bool mean = n % 2 == 1;
          const auto input = make_input(n, dt, numel);
          const Plan plan = cpu.make_plan(dt, numel, topology_chunks(topo, n));
          const auto want = run(topo, n, dt, mean, plan, input, [&](int) -> const Codec& { return cpu; }, false);
          auto& codecs = gpu[n];
          for (int r = int(codecs.size()); r < n; ++r) codecs.push_back(std::make_unique<cuda::BitsplitCudaCodec>(prm));
          const auto got =
              run(topo, n, dt, mean, plan, input, [&](int r) -> const Codec& { return *codecs[size_t(r)]; }, true);
          expect_same(got, want, input[0]);
        }
  }
}

// Mode none (and the exact path): the identity codec on the GPU, zero-copy
// views included, against the CPU one; fp16 too.
TEST(CudaCollective, IdentitySameResultsAndBytesAsTheCpuCodecOnEveryRank) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t numel = 4099;
  const IdentityCodec cpu;
  const cuda::IdentityCudaCodec gpu;
  for (Topology topo : schedule_topologies())
    for (int n : {2, 3, 5})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        SCOPED_TRACE(std::string(topology_name(topo)) + " n=" + std::to_string(n) + " " + dtype_name(dt));
        const bool mean = n % 2 == 1;
        const auto input = make_input(n, dt, numel);
        const Plan plan = make_identity_plan(dt, numel, topology_chunks(topo, n));
        const auto want = run(topo, n, dt, mean, plan, input, [&](int) -> const Codec& { return cpu; }, false);
        const auto got = run(topo, n, dt, mean, plan, input, [&](int) -> const Codec& { return gpu; }, true);
        expect_same(got, want, input[0]);
      }
  // compress from the bucket into another buffer (the executor sends from the
  // bucket itself, through wire_view, so the all-reduce above never does this)
  const Plan plan = make_identity_plan(DType::kBF16, numel, 3);
  const auto x = make_input(1, DType::kBF16, numel)[0];
  const Block blk{plan.chunk_begin[1], plan.chunk_begin[2]};
  const size_t bytes = gpu.static_bytes(plan, blk);
  uint8_t *dx = nullptr, *dout = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
  Local lx;
  lx.bucket = dx;
  ASSERT_EQ(gpu.compress(lx, plan, blk, RngCtx(), dout), bytes);
  std::vector<uint8_t> h(bytes);
  ASSERT_EQ(cudaMemcpy(h.data(), dout, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  const size_t off = size_t(blk.w0 * plan.unit) * 2;
  EXPECT_EQ(h, std::vector<uint8_t>(x.begin() + long(off), x.begin() + long(off + bytes)));
  cudaFree(dx);
  cudaFree(dout);
}

// Mode lossless: two-part messages (the executor reads the dynamic part's size
// from a header the codec copies to the host), every exponent format the data
// picks, fp32/bf16/fp16; bytes sent include the dynamic parts.
TEST(CudaCollective, LosslessSameResultsAndBytesAsTheCpuCodecOnEveryRank) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t numel = 20000 + 13;  // a tail that travels verbatim
  for (uint32_t formats : {0xfu, 0x1u, 0x5u}) {
    LosslessOptions opt;
    opt.formats = formats;
    const LosslessCodec cpu(opt);
    const cuda::LosslessCudaCodec gpu(opt);
    for (Topology topo : schedule_topologies())
      for (int n : {2, 3})
        for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
          SCOPED_TRACE("formats " + std::to_string(formats) + " " + topology_name(topo) + " n=" + std::to_string(n) +
                       " " + dtype_name(dt));
          const bool mean = n % 2 == 1;
          const auto input = make_input(n, dt, numel);
          const Plan plan = make_lossless_plan(dt, numel, topology_chunks(topo, n));
          const auto want = run(topo, n, dt, mean, plan, input, [&](int) -> const Codec& { return cpu; }, false);
          const auto got = run(topo, n, dt, mean, plan, input, [&](int) -> const Codec& { return gpu; }, true);
          expect_same(got, want, input[0]);
        }
  }
}

// The collective on the host, in place on every rank's bucket (the oracle of
// the device runs); every rank's stats.
std::vector<CallStats> host_all_reduce(const CollectiveConfig& cfg, std::vector<std::vector<uint8_t>>& data,
                                       DType dt, int64_t numel, ReduceOp op, uint64_t seq) {
  const int n = int(data.size());
  std::vector<CallStats> st(static_cast<size_t>(n));
  InprocWorld world(n, std::chrono::seconds(120));
  world.run([&](int r, Transport& tr) {
    CallArgs a;
    a.data = data[size_t(r)].data();
    a.dtype = dt;
    a.numel = numel;
    a.op = op;
    a.seq = seq;
    st[size_t(r)] = all_reduce(tr, cfg, a);
  });
  return st;
}

// The whole collective driver (local pass, header, metadata all-reduce,
// allocator, plan, execute, exact paths) with the buckets on the device
// (CallArgs::device) and operations posted as for NCCL (posts_in_order),
// against the same call on the host with the default posting: every mode,
// topology, n = 2 and 3, fp32/bf16, sum/mean, and a bucket with an inf (the
// exact path). The posting runs under both of NCCL's ordering models.
TEST(CudaCollective, TheDriverOnTheDeviceEqualsTheHostInEveryMode) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t numel = 256 * 40 + 5;
  // every registered mode with a CUDA codec (a test-only one registered from its folder too)
  for (const ModeInfo& m : registered_modes())
    for (Topology topo : schedule_topologies())
      for (int n : {2, 3})
        for (DType dt : {DType::kF32, DType::kBF16})
          for (bool inf : {false, true}) {
            const Mode mode = m.id;
            if (!has_device_codec(mode, cuda::device().name())) continue;
            CollectiveConfig probe;
            probe.mode = mode;
            const auto scheme = make_scheme(probe);
            if (inf && scheme->exact()) continue;  // (an exact mode's path is the same with an inf)
            SCOPED_TRACE(std::string(mode_name(mode)) + " " + topology_name(topo) + " n=" + std::to_string(n) + " " +
                         dtype_name(dt) + (inf ? " with an inf" : ""));
            CollectiveConfig cfg;
            cfg.mode = mode;
            cfg.topology = topo;
            set_if_declared(mode, cfg.params, "bits", num_value(mode == mode_id("bitsplit") ? 3.0 : 5.0));
            cfg.block_bytes = 4096;  // several blocks per chunk
            auto input = make_input(n, dt, numel);
            if (inf) {
              const float v = std::numeric_limits<float>::infinity();
              if (dt == DType::kF32) std::memcpy(input[1].data() + 4 * 77, &v, 4);
              else {
                const uint16_t h = f32_to_bf16(v);
                std::memcpy(input[1].data() + 2 * 77, &h, 2);
              }
            }
            const ReduceOp op = n == 3 ? ReduceOp::kMean : ReduceOp::kSum;
            std::vector<std::vector<uint8_t>> host = input, dev_out(static_cast<size_t>(n));
            const std::vector<CallStats> hs = host_all_reduce(cfg, host, dt, numel, op, 3);
            std::vector<CallStats> ds(static_cast<size_t>(n));
            {
              InprocWorld world(n, std::chrono::seconds(120), &cuda::device().memory());
              // posted as for NCCL (matched in posting order, no tags)
              world.set_posts_in_order(true);
              world.run([&](int r, Transport& tr) {
                const auto& x = input[size_t(r)];
                void* d = nullptr;
                ASSERT_EQ(cudaMalloc(&d, x.size()), cudaSuccess);
                ASSERT_EQ(cudaMemcpy(d, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
                CallArgs a;
                a.data = d;
                a.dtype = dt;
                a.numel = numel;
                a.op = op;
                a.seq = 3;
                a.device = &cuda::device();
                ds[size_t(r)] = all_reduce(tr, cfg, a);
                dev_out[size_t(r)].resize(x.size());
                ASSERT_EQ(cudaMemcpy(dev_out[size_t(r)].data(), d, x.size(), cudaMemcpyDeviceToHost), cudaSuccess);
                cudaFree(d);
              });
              const auto v = world.nccl_order_violations();
              EXPECT_TRUE(v.empty()) << v[0];
              EXPECT_EQ(world.nccl_stream_deadlock(), "");
            }
            EXPECT_EQ(hs[0].path, inf ? Path::kExactNonfinite : scheme->identity() ? Path::kExactMode : Path::kCompressed);
            for (int r = 0; r < n; ++r) {
              EXPECT_EQ(dev_out[size_t(r)], host[size_t(r)]) << "rank " << r;
              EXPECT_EQ(ds[size_t(r)].path, hs[size_t(r)].path) << "rank " << r;
              EXPECT_EQ(ds[size_t(r)].bytes_sent, hs[size_t(r)].bytes_sent) << "rank " << r;
              EXPECT_EQ(ds[size_t(r)].meta_bytes_sent, hs[size_t(r)].meta_bytes_sent) << "rank " << r;
              EXPECT_EQ(ds[size_t(r)].bits_per_coord, hs[size_t(r)].bits_per_coord) << "rank " << r;
            }
          }
}

// Super-groups whose working set exceeds a block's shared memory (48 KiB
// without an opt-in): the device codec refuses them when it is made, with the
// reason, and the driver makes it before the header exchange, so every rank
// raises at once instead of failing a launch in the middle of the collective.
TEST(CudaCollective, SuperGroupsTooLargeForSharedMemoryRaiseBeforeAnySend) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto params = [](int S, int s) {
    DynamiqParams p;
    p.fmt.S = S;
    p.fmt.s = s;
    return p;
  };
  EXPECT_NO_THROW(cuda::DynamiqCudaCodec(params(8192, 16)));  // 45,072 bytes
  EXPECT_NO_THROW(cuda::DynamiqCudaCodec(params(4096, 2)));
  for (auto [S, s] : {std::pair{8192, 8}, std::pair{4096, 1}, std::pair{16384, 16}}) {
    try {
      cuda::DynamiqCudaCodec c(params(S, s));
      ADD_FAILURE() << "S=" << S << " s=" << s << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dynamiq (CUDA):"), std::string::npos) << e.what();
    }
  }
  const int n = 3;
  const int64_t numel = 8192 * 3;
  CollectiveConfig cfg;
  cfg.mode = mode_id("dynamiq");
  cfg.params.set("supergroup_size", double(8192));
  cfg.params.set("group_size", double(8));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<double> secs(static_cast<size_t>(n), 0.0);
  InprocWorld world(n, std::chrono::seconds(20), &cuda::device().memory());
  world.set_posts_in_order(true);
  world.run([&](int r, Transport& tr) {
    std::vector<float> x(static_cast<size_t>(numel), 1.0f + float(r));
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    CallArgs a;
    a.data = d;
    a.numel = numel;
    a.device = &cuda::device();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      all_reduce(tr, cfg, a);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
    secs[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cudaFree(d);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[size_t(r)].find("bytes of shared memory per block"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
    EXPECT_LT(secs[size_t(r)], 10.0) << "rank " << r;
  }
  EXPECT_EQ(world.messages_posted(), 0) << "nothing may be sent before the error";
}

// Malformed input raises MalformedMessage from the CUDA codecs as from the CPU
// ones: a wrong size (before any launch) and, for bit-split, a spike index out
// of range (a device flag, raised by finish(), which the executor calls once
// per collective); the codec decodes the next good message normally.
TEST(CudaCollective, MalformedMessagesRaiseAndTheCodecRecovers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const BitsplitParams prm{2, 32, true, false};
  cuda::BitsplitCudaCodec codec(prm);
  const int64_t numel = 1000;
  const Plan plan = codec.cpu().make_plan(DType::kF32, numel, 1);
  const Block all{0, plan.num_units};
  const size_t bytes = codec.static_bytes(plan, all);
  const auto x = make_input(1, DType::kF32, numel)[0];
  void *dx = nullptr, *dy = nullptr;
  uint8_t* dm = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, x.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dm, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
  Local lx;
  lx.bucket = dx;
  RngCtx rng;
  ASSERT_EQ(codec.compress(lx, plan, all, rng, dm), bytes);
  std::vector<uint8_t> good(bytes);
  ASSERT_EQ(cudaMemcpy(good.data(), dm, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  Output y;
  y.bucket = dy;
  EXPECT_THROW(codec.decompress(dm, bytes - 1, plan, all, y), MalformedMessage);
  std::vector<uint8_t> bad = good;
  bad.back() = 255;  // the last spike index: past its group
  ASSERT_EQ(cudaMemcpy(dm, bad.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  // (a spike index is checked on the device: finish(), once per collective, raises)
  EXPECT_NO_THROW(codec.finish());
  codec.decompress(dm, bytes, plan, all, y);
  EXPECT_THROW(codec.finish(), MalformedMessage);
  EXPECT_NO_THROW(codec.finish()) << "the flag was not cleared";
  std::vector<float> acc(size_t(plan.num_units * plan.unit));
  float* dacc = nullptr;
  ASSERT_EQ(cudaMalloc(&dacc, acc.size() * sizeof(float)), cudaSuccess);
  codec.decompress_accumulate(dm, bytes, lx, plan, all, dacc);
  EXPECT_THROW(codec.finish(), MalformedMessage);
  ASSERT_EQ(cudaMemcpy(dm, good.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_NO_THROW(codec.decompress(dm, bytes, plan, all, y));
  EXPECT_NO_THROW(codec.finish());
  // a message at an odd address: the device code reads 32-bit words, so it is
  // refused before any launch instead of faulting on a GPU
  uint8_t* odd = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&odd), bytes + 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(odd + 2, good.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  try {
    codec.decompress(odd + 2, bytes, plan, all, y);
    ADD_FAILURE() << "a misaligned message was decoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not 4-byte aligned"), std::string::npos) << e.what();
  }
  EXPECT_THROW(codec.compress(lx, plan, all, rng, odd + 2), Error);
  cudaFree(odd);
  // DynamiQ: only the size can be wrong
  cuda::DynamiqCudaCodec dq;
  const Plan dplan = make_dynamiq_plan(DType::kF32, numel, dq.cpu().params().fmt, std::vector<uint8_t>(4, 4), {}, {}, 1);
  const Block dall{0, dplan.num_units};
  EXPECT_THROW(dq.decompress(dm, dq.static_bytes(dplan, dall) + 1, dplan, dall, y), MalformedMessage);
  for (void* p : {dx, dy, static_cast<void*>(dm), static_cast<void*>(dacc)}) cudaFree(p);
}

// Reduce-scatter and all-gather (collective(), CallArgs::kind) with input and
// output on the device and operations posted as for NCCL, against the same
// call on the host with the default posting: every mode (all-gather: none and
// lossless), topology, n = 2 and 5 (butterfly with extra ranks), fp32 and
// bf16, shards whole units and padded by padded_shard. Every rank's output and
// byte counts must equal the host's, and the posting must run under both of
// NCCL's ordering models.
TEST(CudaCollective, ReduceScatterAndAllGatherOnTheDeviceEqualTheHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (Collective kind : {Collective::kReduceScatter, Collective::kAllGather})
    for (Mode mode : {mode_id("none"), mode_id("dynamiq"), mode_id("bitsplit"), mode_id("lossless")})
      for (Topology topo : schedule_topologies(kind))
        for (int n : {2, 5})
          for (DType dt : {DType::kF32, DType::kBF16}) {
            if (kind == Collective::kAllGather && mode != mode_id("none") && mode != mode_id("lossless")) continue;
            SCOPED_TRACE(std::string(collective_name(kind)) + " " + mode_name(mode) + " " + topology_name(topo) +
                         " n=" + std::to_string(n) + " " + dtype_name(dt));
            CollectiveConfig cfg;
            cfg.mode = mode;
            cfg.topology = topo;
            cfg.block_bytes = 4096;
            const int64_t shard = padded_shard(cfg, kind, n, 256 * 12 + 5);
            const int64_t numel = n * shard;
            const int64_t es = dtype_size(dt);
            auto input = make_input(n, dt, numel);  // (all-gather: each rank's buffer, its own slot the input)
            const size_t out_bytes = size_t(kind == Collective::kReduceScatter ? shard : numel) * size_t(es);
            std::vector<std::vector<uint8_t>> host_out(static_cast<size_t>(n)), dev_out(static_cast<size_t>(n));
            std::vector<CallStats> hs(static_cast<size_t>(n)), ds(static_cast<size_t>(n));
            const ReduceOp op = n == 5 ? ReduceOp::kMean : ReduceOp::kSum;
            auto args = [&](void* data, void* out) {
              CallArgs a;
              a.kind = kind;
              a.data = data;
              a.output = kind == Collective::kReduceScatter ? out : nullptr;
              a.dtype = dt;
              a.numel = numel;
              a.op = op;
              a.seq = 5;
              return a;
            };
            {
              InprocWorld world(n, std::chrono::seconds(120));
              world.run([&](int r, Transport& tr) {
                std::vector<uint8_t> x = input[size_t(r)], y(out_bytes);
                hs[size_t(r)] = collective(tr, cfg, args(x.data(), y.data()));
                host_out[size_t(r)] = kind == Collective::kReduceScatter ? y : x;
              });
            }
            {
              InprocWorld world(n, std::chrono::seconds(120), &cuda::device().memory());
              world.set_posts_in_order(true);
              world.run([&](int r, Transport& tr) {
                const auto& x = input[size_t(r)];
                void *d = nullptr, *o = nullptr;
                ASSERT_EQ(cudaMalloc(&d, x.size()), cudaSuccess);
                ASSERT_EQ(cudaMalloc(&o, out_bytes), cudaSuccess);
                ASSERT_EQ(cudaMemcpy(d, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
                CallArgs a = args(d, o);
                a.device = &cuda::device();
                ds[size_t(r)] = collective(tr, cfg, a);
                const bool rs = kind == Collective::kReduceScatter;
                dev_out[size_t(r)].resize(rs ? out_bytes : x.size());
                ASSERT_EQ(cudaMemcpy(dev_out[size_t(r)].data(), rs ? o : d, dev_out[size_t(r)].size(),
                                     cudaMemcpyDeviceToHost),
                          cudaSuccess);
                cudaFree(d);
                cudaFree(o);
              });
              const auto v = world.nccl_order_violations();
              EXPECT_TRUE(v.empty()) << v[0];
              EXPECT_EQ(world.nccl_stream_deadlock(), "");
            }
            for (int r = 0; r < n; ++r) {
              EXPECT_EQ(dev_out[size_t(r)], host_out[size_t(r)]) << "rank " << r;
              EXPECT_EQ(ds[size_t(r)].path, hs[size_t(r)].path) << "rank " << r;
              EXPECT_EQ(ds[size_t(r)].bytes_sent, hs[size_t(r)].bytes_sent) << "rank " << r;
            }
            if (kind == Collective::kAllGather)
              for (int r = 1; r < n; ++r) EXPECT_EQ(host_out[size_t(r)], host_out[0]) << "rank " << r;
          }
}

#if defined(DYNAMIQ_CUDA_EMULATION)
// On a GPU the collective runs beside the training's kernels (DDP hands a
// bucket over while the backward pass goes on): everything it does must be
// ordered on the stream made current for it (the group worker's own,
// cuda::StreamScope), and nothing may synchronise with the legacy default
// stream or the whole device (cudaMalloc/cudaFree/cudaMemcpy/cudaMemset/
// cudaDeviceSynchronize would wait for the training's queued kernels). The
// emulator logs every runtime call with its stream and thread: every launch,
// copy, memset, allocation and wait of a rank must be on that rank's stream
// (frees are stream-ordered cudaFreeAsync, on any stream: the executor's pool
// also frees when its thread exits, after the scope). Every mode, ring and
// butterfly, 3 ranks, a bucket with an inf (statistics, non-finite scan and
// the exact fallback), correlated and independent rounding; results equal the
// host run.
TEST(CudaCollective, TheDriverKeepsAllDeviceWorkOnTheCurrentStream) {
  const int n = 3;
  const int64_t numel = 256 * 40 + 5;
  const DType dt = DType::kF32;
  struct Case {
    Mode mode;
    Topology topo;
    bool inf;
    bool correlated;
  };
  std::vector<Case> cases;
  for (Mode mode : {mode_id("none"), mode_id("dynamiq"), mode_id("bitsplit"), mode_id("lossless")})
    for (Topology topo : {kTopologyRing, topology_id("butterfly")}) cases.push_back({mode, topo, false, true});
  cases.push_back({mode_id("dynamiq"), kTopologyRing, true, true});
  cases.push_back({mode_id("bitsplit"), kTopologyRing, true, true});
  cases.push_back({mode_id("dynamiq"), topology_id("twostep"), false, false});
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(mode_name(c.mode)) + " " + topology_name(c.topo) + (c.inf ? " with an inf" : "") +
                 (c.correlated ? "" : " independent"));
    CollectiveConfig cfg;
    cfg.mode = c.mode;
    cfg.topology = c.topo;
    set_if_declared(c.mode, cfg.params, "bits", num_value(c.mode == mode_id("bitsplit") ? 3.0 : 5.0));
    if (c.mode == mode_id("dynamiq")) cfg.params.set("rounding", c.correlated ? "correlated" : "independent");
    cfg.block_bytes = 4096;
    auto input = make_input(n, dt, numel);
    if (c.inf) {
      const float v = std::numeric_limits<float>::infinity();
      std::memcpy(input[1].data() + 4 * 77, &v, 4);
    }
    std::vector<std::vector<uint8_t>> host = input;
    host_all_reduce(cfg, host, dt, numel, ReduceOp::kSum, 5);
    // buckets and streams made before the log starts (legacy calls of the test's own)
    std::vector<void*> bucket(static_cast<size_t>(n));
    std::vector<cudaStream_t> stream(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(cudaMalloc(&bucket[size_t(r)], input[size_t(r)].size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(bucket[size_t(r)], input[size_t(r)].data(), input[size_t(r)].size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream[size_t(r)], cudaStreamNonBlocking), cudaSuccess);
    }
    std::vector<std::thread::id> thread_of(static_cast<size_t>(n));
    std::vector<CallStats> ds(static_cast<size_t>(n));
    clear_device_codecs();  // codecs of earlier tests, which the cache could drop during the log
    dynamiq_cuda_emu::set_api_log(true);
    {
      InprocWorld world(n, std::chrono::seconds(120), &cuda::device().memory());
      world.set_posts_in_order(true);
      world.run([&](int r, Transport& tr) {
        thread_of[size_t(r)] = std::this_thread::get_id();
        cuda::StreamScope scope(stream[size_t(r)]);
        CallArgs a;
        a.data = bucket[size_t(r)];
        a.dtype = dt;
        a.numel = numel;
        a.seq = 5;
        a.device = &cuda::device();
        ds[size_t(r)] = all_reduce(tr, cfg, a);
        EXPECT_GT(device_codecs_cached(), 0u);  // kept for the next collective on this stream
        release_device_codecs(stream[size_t(r)]);  // (its frees are checked below)
        // the executor's buffers are freed when this thread ends, on no stream of
        // ours: our queued work must be done by then (as the Python worker does)
        EXPECT_EQ(cudaStreamSynchronize(stream[size_t(r)]), cudaSuccess);
      });
    }
    const std::vector<dynamiq_cuda_emu::ApiCall> log = dynamiq_cuda_emu::api_log();
    dynamiq_cuda_emu::set_api_log(false);

    EXPECT_EQ(ds[0].path, c.inf ? Path::kExactNonfinite : c.mode == mode_id("none") ? Path::kExactMode : Path::kCompressed);
    std::map<std::string, int> count;
    for (const auto& call : log) {
      const std::string name = call.name;
      count[name] += 1;
      const auto it = std::find(thread_of.begin(), thread_of.end(), call.thread);
      ASSERT_NE(it, thread_of.end()) << name << " from a thread that is no rank's";
      const cudaStream_t mine = stream[size_t(it - thread_of.begin())];
      EXPECT_TRUE(name != "cudaMalloc" && name != "cudaFree" && name != "cudaMemcpy" && name != "cudaMemset" &&
                  name != "cudaDeviceSynchronize")
          << name << ": synchronises with the legacy default stream (and the training's kernels)";
      // cudaFreeHost waits for the whole device: only the codecs' release at the end (a
      // worker's teardown) may call it, once per rank (counted below)
      if (name == "cudaFreeHost") continue;
      // (page-locked allocations and event waits name no stream)
      if (name != "cudaFreeAsync" && name != "cudaMemPoolTrimTo" && name != "cudaHostAlloc" &&
          name != "cudaEventSynchronize")
        EXPECT_EQ(call.stream, mine) << name << " on another stream than its rank's";
      if (name == "cudaFreeAsync") EXPECT_TRUE(call.stream == mine || call.stream == nullptr) << name;
    }
    // the run did device work on the streams (not a vacuous log)
    EXPECT_GT(count["launch"], 0);
    EXPECT_GT(count["cudaStreamSynchronize"], 0);
    EXPECT_GT(count["cudaMallocFromPoolAsync"], 0);
    EXPECT_EQ(count["cudaMallocFromPoolAsync"], count["cudaFreeAsync"]) << "device memory not given back";
    EXPECT_LE(count["cudaFreeHost"], n);

    for (int r = 0; r < n; ++r) {
      std::vector<uint8_t> got(input[size_t(r)].size());
      ASSERT_EQ(cudaMemcpy(got.data(), bucket[size_t(r)], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, host[size_t(r)]) << "rank " << r;
      cudaFree(bucket[size_t(r)]);
      cudaStreamDestroy(stream[size_t(r)]);
    }
  }
}
// A worker that runs collectives on two GPUs (one group used with tensors on
// cuda:0 and cuda:1) keeps a buffer pool per device: a buffer made on one
// device must never be handed to a collective on another (the emulator's
// device ids are labels, so the test checks the pools, not the memory).
TEST(CudaCollective, BufferPoolsArePerDevice) {
  const int n = 2;
  const int64_t numel = 256 * 40;
  CollectiveConfig cfg;
  cfg.mode = mode_id("dynamiq");
  auto input = make_input(n, DType::kF32, numel);
  std::vector<size_t> on1(static_cast<size_t>(n)), on0(static_cast<size_t>(n));
  InprocWorld world(n, std::chrono::seconds(60), &cuda::device().memory());
  world.run([&](int r, Transport& tr) {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, input[size_t(r)].size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, input[size_t(r)].data(), input[size_t(r)].size(), cudaMemcpyHostToDevice), cudaSuccess);
    CallArgs a;
    a.data = d;
    a.numel = numel;
    a.device = &cuda::device();
    all_reduce(tr, cfg, a);
    on1[size_t(r)] = executor_pool_bytes(&cuda::device_memory());
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    on0[size_t(r)] = executor_pool_bytes(&cuda::device_memory());
    cudaFree(d);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_GT(on1[size_t(r)], 0u) << "rank " << r;
    EXPECT_EQ(on0[size_t(r)], 0u) << "rank " << r << ": device 1's buffers offered on device 0";
  }
}

#endif

}  // namespace
}  // namespace dynamiq
