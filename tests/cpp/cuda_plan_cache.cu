// The CUDA DynamiQ codec keeps the device copy of a plan's arrays under the
// plan's identity (PlanKey, csrc/kernels/plan_key.h), not its contents, and
// uploads a plan once however many calls use it. Identity must never take
// one plan for another: a copy changed after the codec saw the original, a
// plan changed in place and touch()ed, a plan made where a freed one was,
// plans taking turns on one codec, codecs on two streams. Every call's bytes
// must equal the CPU codec's with the same plan. On the emulation the
// codec's stream is a queue that runs only when the host waits, so a
// page-locked buffer rewritten before its copy ran, or device arrays
// rewritten under a queued kernel, would show here. With nvcc it runs on a
// GPU and skips without one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <new>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

const int64_t kNumel = 256 * 12 + 37;  // a partial last super-group

// Mixed widths from `seed`, wire order sorted by width, a bias per super-group.
Plan test_plan(int seed, const DynamiqFormat& f = DynamiqFormat()) {
  const int64_t units = ceil_div<int64_t>(kNumel, f.S);
  std::vector<uint8_t> bits(static_cast<size_t>(units));
  std::vector<float> bias(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u) {
    bits[size_t(u)] = uint8_t(kDynamiqWidths[(u * 3 + seed) % 5]);
    bias[size_t(u)] = 0.05f * float((u + seed) % 5);
  }
  std::vector<int32_t> order(static_cast<size_t>(units));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bits[size_t(a)] < bits[size_t(b)]; });
  return make_dynamiq_plan(DType::kF32, kNumel, f, bits, order, bias, 2);
}

// A bucket on the device, the codec under test and the CPU codec to compare with.
class Fixture {
 public:
  explicit Fixture(cudaStream_t st) : gpu(DynamiqParams(), st), st_(st) {
    x_ = dqtest::gaussian(size_t(kNumel), 21);
    EXPECT_EQ(cudaMalloc(&d_x_, x_.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d_x_, x_.data(), x_.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d_out_, kMaxBytes), cudaSuccess);
  }
  ~Fixture() {
    cudaFree(d_x_);
    cudaFree(d_out_);
  }
  std::vector<uint8_t> cpu_bytes(const Plan& p) const { return dqtest::compress_bucket(cpu, p, x_.data(), rng()); }
  // The GPU codec's message, waited for.
  std::vector<uint8_t> gpu_bytes(const Plan& p) const {
    std::vector<uint8_t> out(enqueue(p, d_out_));
    EXPECT_LE(out.size(), kMaxBytes);
    EXPECT_EQ(cudaStreamSynchronize(st_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), d_out_, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  // The GPU codec's message into dst, not waited for; returns its size.
  size_t enqueue(const Plan& p, void* dst) const {
    Local x;
    x.bucket = d_x_;
    return gpu.compress(x, p, dqtest::whole(p), rng(), static_cast<uint8_t*>(dst));
  }

  const DynamiqCodec cpu;
  const cuda::DynamiqCudaCodec gpu;
  static constexpr size_t kMaxBytes = size_t(kNumel) * 4 + 4096;

 private:
  static RngCtx rng() { return dqtest::rng_ctx(5, 6, 1, 3); }
  cudaStream_t st_;
  std::vector<float> x_;
  void* d_x_ = nullptr;
  void* d_out_ = nullptr;
};

std::vector<uint8_t> read(const void* d, size_t n) {
  std::vector<uint8_t> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

#if defined(DYNAMIQ_CUDA_EMULATION)
// Plan uploads (the codec's only event records) while the log is on.
int uploads() {
  int n = 0;
  for (const auto& c : dynamiq_cuda_emu::api_log()) n += std::string(c.name) == "cudaEventRecord";
  return n;
}
#endif

TEST(CudaPlanCache, DynamiqUploadsEachPlanOnceAndNeverTakesOneForAnother) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  {
    Fixture f(st);
    const Plan a = test_plan(0), b = test_plan(1), c = test_plan(2);
    const auto want_a = f.cpu_bytes(a), want_b = f.cpu_bytes(b), want_c = f.cpu_bytes(c);
    ASSERT_NE(want_a, want_b);
    ASSERT_NE(want_a, want_c);

    // calls queued before any wait, each checked once the stream has run them
    auto queued = [&](const std::vector<const Plan*>& plans, int expect_uploads) {
#if defined(DYNAMIQ_CUDA_EMULATION)
      dynamiq_cuda_emu::set_api_log(true);
#endif
      std::vector<void*> outs(plans.size());
      std::vector<size_t> sizes(plans.size());
      for (size_t i = 0; i < plans.size(); ++i) {
        ASSERT_EQ(cudaMalloc(&outs[i], Fixture::kMaxBytes), cudaSuccess);
        sizes[i] = f.enqueue(*plans[i], outs[i]);
      }
#if defined(DYNAMIQ_CUDA_EMULATION)
      EXPECT_EQ(uploads(), expect_uploads);
      dynamiq_cuda_emu::set_api_log(false);
#else
      (void)expect_uploads;
#endif
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      for (size_t i = 0; i < plans.size(); ++i) {
        const Plan* q = plans[i];
        EXPECT_EQ(read(outs[i], sizes[i]), q == &a ? want_a : q == &b ? want_b : want_c) << "call " << i;
        cudaFree(outs[i]);
      }
    };
    // two plans taking turns on one codec: one upload each
    queued({&a, &b, &a, &b, &a, &b}, 2);
    // three: a call with the third evicts the least recently used plan, whose
    // device arrays the calls queued before it still read (stream order)
    queued({&a, &b, &c, &a, &b, &c}, 4);

    // a copy of a plan the codec has seen (a), then changed: a plan of its own
    Plan changed = a;
    for (uint8_t& w : changed.bits) w = w == 2 ? 8 : w;
    dynamiq_fill_wire_offsets(changed, DynamiqFormat());
    const auto want_changed = f.cpu_bytes(changed);
    ASSERT_NE(want_changed, want_a);
    EXPECT_EQ(f.gpu_bytes(changed), want_changed);
    EXPECT_EQ(f.gpu_bytes(a), want_a);

    // changed in place, with the same array sizes, and touch()ed
    Plan in_place = test_plan(0);
    EXPECT_EQ(f.gpu_bytes(in_place), want_a);
    for (float& m : in_place.bias) m += 0.5f;
    in_place.touch();
    const auto want_in_place = f.cpu_bytes(in_place);
    ASSERT_NE(want_in_place, want_a);
    EXPECT_EQ(f.gpu_bytes(in_place), want_in_place);

    // a plan freed and another made in its place: same sizes, other widths
    alignas(Plan) unsigned char where[sizeof(Plan)];
    Plan* p = new (where) Plan(test_plan(3));
    EXPECT_EQ(f.gpu_bytes(*p), f.cpu_bytes(*p));
    p->~Plan();
    p = new (where) Plan(test_plan(4));
    EXPECT_EQ(f.gpu_bytes(*p), f.cpu_bytes(*p));
    p->~Plan();
  }
  cudaStreamDestroy(st);
}

// Two codecs on two streams (the executor's cache keeps one per stream), each
// with its own plan, calls interleaved and queued on both streams before
// either is waited for; every third call with a fresh copy of its plan.
TEST(CudaPlanCache, DynamiqCodecsOnTwoStreamsKeepTheirOwnPlans) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t st[2] = {nullptr, nullptr};
  for (cudaStream_t& s : st) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  {
    Fixture f0(st[0]), f1(st[1]);
    const Plan p0 = test_plan(0), p1 = test_plan(1);
    const auto want0 = f0.cpu_bytes(p0), want1 = f1.cpu_bytes(p1);
    ASSERT_NE(want0, want1);
    std::vector<void*> outs(8);
    std::vector<size_t> sizes(8);
    for (size_t i = 0; i < outs.size(); ++i) {
      ASSERT_EQ(cudaMalloc(&outs[i], Fixture::kMaxBytes), cudaSuccess);
      const bool one = i % 2 == 1;
      const Plan copy = one ? p1 : p0;
      sizes[i] = (one ? f1 : f0).enqueue(i % 3 == 2 ? copy : one ? p1 : p0, outs[i]);
    }
    for (cudaStream_t s : st) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (size_t i = 0; i < outs.size(); ++i) {
      EXPECT_EQ(read(outs[i], sizes[i]), i % 2 ? want1 : want0) << "call " << i;
      cudaFree(outs[i]);
    }
  }
  for (cudaStream_t s : st) cudaStreamDestroy(s);
}

}  // namespace
}  // namespace dynamiq
