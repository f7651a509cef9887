// GPU bit-split kernels against the CPU codec: the same bytes for compress and
// the fused role, the same values for decompress and decompress-accumulate,
// malformed spike indices flagged. With nvcc it runs on a GPU and skips when
// none is present; CI runs it on the CPU emulation of CUDA (tests/cpp/cuda_emu).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/bitsplit/bitsplit_cuda.h"
#include "test_bitsplit_util.h"

namespace dynamiq {
namespace {

using namespace bstest;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, count * sizeof(T) + 16), cudaSuccess); }
  Dev(const T* host, size_t count) : Dev(count) {
    EXPECT_EQ(cudaMemcpy(p, host, count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(CudaBitsplit, SameBytesAndValuesAsTheCpuCodec) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Cfg {
    int bits, group;
    bool spikes, log_scales, stochastic;
    DType dt;
  };
  const Cfg cfgs[] = {
      {2, 32, true, false, true, DType::kF32},  {2, 32, true, true, false, DType::kF16},
      {3, 64, true, false, true, DType::kBF16}, {4, 32, false, false, true, DType::kF32},
      {5, 128, false, true, true, DType::kF32}, {6, 128, true, false, false, DType::kBF16},
      {7, 256, false, false, true, DType::kF16}, {8, 128, false, false, true, DType::kF32},
  };
  // data: Gaussian; zeros; a constant; Gaussian with one 1e30 outlier; denormals
  auto data = [](int kind, int64_t n, uint32_t seed) {
    std::vector<float> v = gaussian(n, seed);
    for (size_t i = 0; i < v.size(); ++i) {
      if (kind == 1) v[i] = 0.0f;
      if (kind == 2) v[i] = -0.375f;
      if (kind == 3 && i == 40) v[i] = 1e30f;
      if (kind == 4) v[i] *= 1e-39f;
    }
    return v;
  };
  for (int kind = 0; kind < 5; ++kind) {
    for (const Cfg& k : cfgs) {
      BitsplitParams p;
      p.bits = k.bits;
      p.group = k.group;
      p.spikes = k.spikes;
      p.log_scales = k.log_scales;
      const BitsplitCodec codec(p);
      const int64_t numel = 5 * codec.unit() + 3 * k.group + 7;
      const Bucket mine = make_bucket(k.dt, data(kind, numel, 1));
      const Bucket theirs = make_bucket(k.dt, data(kind, numel, 2));
      const Plan plan = codec.make_plan(k.dt, numel, 2);
      const size_t es = size_t(dtype_size(k.dt));
      for (int c = 0; c < 2; ++c) {
        const Block blk{plan.chunk_begin[size_t(c)], plan.chunk_begin[size_t(c) + 1]};
        const int64_t e0 = blk.w0 * plan.unit, e1 = std::min(blk.w1 * plan.unit, numel);
        BitsplitCudaBlock cb;
        cb.f = codec.format(k.dt);
        cb.e0 = e0;
        cb.e1 = e1;
        const RngCtx r0 = rng_ctx(5, 6, 0, k.stochastic), r1 = rng_ctx(5, 6, 1, k.stochastic);
        const size_t bytes = codec.static_bytes(plan, blk);
        const std::string what =
            "bits=" + std::to_string(k.bits) + " chunk " + std::to_string(c) + " data " + std::to_string(kind);

        // compress (leaf, from the bucket)
        std::vector<uint8_t> cpu_in(bytes);
        Local lt;
        lt.bucket = theirs.data();
        codec.compress(lt, plan, blk, r1, cpu_in.data());
        const auto* tb = static_cast<const uint8_t*>(theirs.data()) + size_t(e0) * es;
        Dev<uint8_t> d_theirs(tb, size_t(e1 - e0) * es), d_in(bytes);
        ASSERT_EQ(bitsplit_compress_cuda(cb, d_theirs.p, false, r1.key, 1, k.stochastic, d_in.p, 0), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(d_in.get(), cpu_in) << what;

        // decompress with a divisor
        Bucket cpu_y = make_bucket(k.dt, std::vector<float>(size_t(numel), 0.0f));
        Output o;
        o.bucket = cpu_y.data();
        o.divisor = 3.0f;
        codec.decompress(cpu_in.data(), bytes, plan, blk, o);
        Dev<uint8_t> d_y(size_t(e1 - e0) * es);
        Dev<int> d_bad(1);
        ASSERT_EQ(cudaMemset(d_bad.p, 0, sizeof(int)), cudaSuccess);
        ASSERT_EQ(bitsplit_decompress_cuda(cb, d_in.p, d_y.p, 3.0f, d_bad.p, 0), cudaSuccess);
        const auto gy = d_y.get();
        ASSERT_EQ(std::memcmp(gy.data(), static_cast<const uint8_t*>(cpu_y.data()) + size_t(e0) * es, gy.size()), 0)
            << what;

        // decompress-accumulate (x = the rank's bucket)
        const int64_t ng = (e1 - e0 + k.group - 1) / k.group;
        std::vector<float> cpu_acc(size_t(blk.units() * plan.unit));
        Local lm;
        lm.bucket = mine.data();
        codec.decompress_accumulate(cpu_in.data(), bytes, lm, plan, blk, cpu_acc.data());
        const auto* mb = static_cast<const uint8_t*>(mine.data()) + size_t(e0) * es;
        Dev<uint8_t> d_mine(mb, size_t(e1 - e0) * es);
        Dev<float> d_acc(size_t(ng * k.group));
        ASSERT_EQ(bitsplit_decompress_accumulate_cuda(cb, d_in.p, d_mine.p, false, d_acc.p, d_bad.p, 0),
                  cudaSuccess);
        const auto ga = d_acc.get();
        for (int64_t i = 0; i < e1 - e0; ++i)
          ASSERT_EQ(f32_bits(ga[size_t(i)]), f32_bits(cpu_acc[size_t(i)])) << what << " i=" << i;

        // fused middle hop, from the bucket and from the accumulator
        std::vector<uint8_t> cpu_out(bytes);
        codec.decompress_accumulate_recompress(cpu_in.data(), bytes, lm, plan, blk, r0, cpu_out.data());
        Dev<uint8_t> d_out(bytes);
        ASSERT_EQ(bitsplit_decompress_accumulate_recompress_cuda(cb, d_in.p, d_mine.p, false, r0.key, 0,
                                                                 k.stochastic, d_out.p, d_bad.p, 0),
                  cudaSuccess);
        ASSERT_EQ(d_out.get(), cpu_out) << what;
        Local la;
        la.acc = cpu_acc.data();
        la.acc_w0 = blk.w0;
        codec.decompress_accumulate_recompress(cpu_in.data(), bytes, la, plan, blk, r0, cpu_out.data());
        ASSERT_EQ(bitsplit_decompress_accumulate_recompress_cuda(cb, d_in.p, d_acc.p, true, r0.key, 0,
                                                                 k.stochastic, d_out.p, d_bad.p, 0),
                  cudaSuccess);
        ASSERT_EQ(d_out.get(), cpu_out) << what << " (accumulator input)";
        ASSERT_EQ(d_bad.get()[0], 0);

        if (k.spikes) {  // a spike index past the group: flagged
          std::vector<uint8_t> bad = cpu_in;
          bad[bad.size() - 1] = 255;
          Dev<uint8_t> d_badmsg(bad.data(), bad.size());
          ASSERT_EQ(bitsplit_decompress_cuda(cb, d_badmsg.p, d_y.p, 1.0f, d_bad.p, 0), cudaSuccess);
          ASSERT_EQ(d_bad.get()[0], 1) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dynamiq
