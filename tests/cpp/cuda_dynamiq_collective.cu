// The DynamiQ all-reduce with the CUDA codec (DynamiqCudaCodec) in place of the
// CPU one, under the real executor and schedules over the in-process transport:
// every topology, worlds 2..5 and 9 (swap-or-not strata), fp32 and bf16, sum
// and mean, several blocks per chunk. Every rank's result and every byte count
// must equal the CPU codec's run. With nvcc it runs on a GPU (the in-process
// transport then hands device pointers between threads, so it needs one GPU
// that all ranks share) and skips without one; CI runs it on the CPU
// emulation of CUDA (tests/cpp/cuda_emu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "hook/executor.h"
#include "hook/inproc_transport.h"
#include "hook/schedule.h"
#include "kernels/cuda/dynamiq_cuda_codec.h"
#include "test_dynamiq_util.h"

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
  InprocWorld world(n, std::chrono::seconds(120));
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

TEST(CudaDynamiqCollective, SameResultsAndBytesAsTheCpuCodecOnEveryRank) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DynamiqParams prm;
  const DynamiqFormat f = prm.fmt;
  const int64_t numel = 256 * 29 + 51;
  const int64_t units = ceil_div<int64_t>(numel, f.S);
  // rank codecs kept across configurations: each must notice the new plan
  std::map<int, std::vector<std::unique_ptr<cuda::DynamiqCudaCodec>>> gpu;
  for (Topology topo : {Topology::kRing, Topology::kButterfly, Topology::kTwoStep})
    for (int n : {2, 3, 5, 9})
      for (DType dt : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(std::string(topology_name(topo)) + " n=" + std::to_string(n) + " " + dtype_name(dt));
        const bool mean = n % 2 == 1;
        std::vector<std::vector<uint8_t>> input(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          const std::vector<float> v = dqtest::gaussian(size_t(numel), uint64_t(100 * n + r));
          auto& b = input[size_t(r)];
          b.resize(size_t(numel) * size_t(dtype_size(dt)));
          for (int64_t i = 0; i < numel; ++i) {
            const float x = v[size_t(i)] + 0.25f;
            if (dt == DType::kF32) {
              std::memcpy(b.data() + 4 * i, &x, 4);
            } else {
              const uint16_t h = f32_to_bf16(x);
              std::memcpy(b.data() + 2 * i, &h, 2);
            }
          }
        }
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
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(got[size_t(r)].bucket, want[size_t(r)].bucket) << "rank " << r;
          EXPECT_EQ(got[size_t(r)].st.bytes_sent, want[size_t(r)].st.bytes_sent) << "rank " << r;
          EXPECT_EQ(got[size_t(r)].st.bytes_received, want[size_t(r)].st.bytes_received) << "rank " << r;
          EXPECT_EQ(got[size_t(r)].bucket, got[0].bucket) << "rank " << r << " differs from rank 0";
        }
        EXPECT_NE(got[0].bucket, input[0]) << "the all-reduce changed nothing";
      }
}

}  // namespace
}  // namespace dynamiq
