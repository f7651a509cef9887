// The test-only "negate" codec's CUDA codec (cuda/negate_cuda_codec.cu), reached only through the
// registry as the collective driver reaches it: the same bytes as the CPU codec for every call,
// dtype and mask, NaN payloads included. (tests/cpp/cuda_collective.cu runs the whole driver on
// the device for every registered mode with a CUDA codec, negate among them.) With nvcc it runs
// on a GPU and skips without one; CI runs it on the CPU emulation of CUDA.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "hook/collective/config.h"
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/base/float_bits.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Dev {
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  void put(const void* h, size_t bytes) { EXPECT_EQ(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<uint8_t> get(size_t bytes) const {
    std::vector<uint8_t> v(bytes);
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void* p = nullptr;
};

// A bucket of `numel` values of dtype dt: Gaussian, with a quiet NaN carrying a payload, an inf
// and a -0 (bytes kept as they are by a first-touch compress and a divisor-1 decompress).
std::vector<uint8_t> bucket(DType dt, int64_t numel, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  const int es = dtype_size(dt);
  std::vector<uint8_t> b(size_t(numel) * size_t(es));
  for (int64_t i = 0; i < numel; ++i) {
    float v = d(g);
    if (i == 5) v = std::numeric_limits<float>::infinity();
    if (i == 6) v = -0.0f;
    if (dt == DType::kF32) {
      uint32_t u = f32_bits(v);
      if (i == 7) u = 0x7fc01234u;  // a quiet NaN with a payload
      std::memcpy(b.data() + 4 * i, &u, 4);
    } else {
      uint16_t h = dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      if (i == 7) h = dt == DType::kBF16 ? 0x7fc5 : 0x7e05;
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

TEST(CudaNegateCodec, SameBytesAsTheCpuCodecForEveryCall) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Mode mode = mode_id("negate");
  ASSERT_TRUE(has_device_codec(mode, cuda::device().name())) << "the folder's CUDA registration line did not run";
  const int64_t numel = 3 * 256 + 41;  // a partial last unit
  for (double mask : {128.0, 1.0, 255.0})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE("mask " + std::to_string(int(mask)) + " " + dtype_name(dt));
      CollectiveConfig cfg;
      cfg.mode = mode;
      cfg.params.set("mask", mask);
      const auto scheme = make_scheme(cfg);
      const Codec& cpu = scheme->codec();
      const std::unique_ptr<Codec> gpu = make_device_codec(mode, cpu, cuda::device());
      const Plan plan = make_identity_plan(dt, numel, 2);
      const Block blk{plan.chunk_begin[1], plan.chunk_begin[2]};  // the second chunk: an offset block
      const size_t bytes = cpu.static_bytes(plan, blk);
      ASSERT_EQ(gpu->static_bytes(plan, blk), bytes);
      const int64_t acc_n = (blk.w1 - blk.w0) * plan.unit;
      const std::vector<uint8_t> x = bucket(dt, numel, 1), peer = bucket(dt, numel, 2);
      std::vector<float> acc(static_cast<size_t>(acc_n));
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = 0.25f * float(int(i % 97) - 48);
      Dev dx(x.size()), dacc(acc.size() * 4), din(bytes), dout(bytes), dy(x.size()), dsum(acc.size() * 4);
      dx.put(x.data(), x.size());
      dacc.put(acc.data(), acc.size() * 4);
      // a peer's message: the CPU codec's compress of its bucket
      std::vector<uint8_t> msg(bytes);
      Local lp;
      lp.bucket = peer.data();
      ASSERT_EQ(cpu.compress(lp, plan, blk, RngCtx(), msg.data()), bytes);
      din.put(msg.data(), bytes);
      Local hx, dxl, hacc, daccl;
      hx.bucket = x.data();
      dxl.bucket = dx.p;
      hacc.acc = acc.data();
      hacc.acc_w0 = blk.w0;
      daccl.acc = static_cast<const float*>(dacc.p);
      daccl.acc_w0 = blk.w0;
      std::vector<uint8_t> want(bytes);
      for (const auto& [h, d, what] : {std::make_tuple(hx, dxl, "compress of the bucket"),
                                       std::make_tuple(hacc, daccl, "compress of an accumulator")}) {
        SCOPED_TRACE(what);
        ASSERT_EQ(cpu.compress(h, plan, blk, RngCtx(), want.data()), bytes);
        ASSERT_EQ(gpu->compress(d, plan, blk, RngCtx(), static_cast<uint8_t*>(dout.p)), bytes);
        EXPECT_EQ(dout.get(bytes), want);
        ASSERT_EQ(cpu.decompress_accumulate_recompress(msg.data(), bytes, h, plan, blk, RngCtx(), want.data()),
                  bytes);
        ASSERT_EQ(gpu->decompress_accumulate_recompress(static_cast<const uint8_t*>(din.p), bytes, d, plan, blk,
                                                        RngCtx(), static_cast<uint8_t*>(dout.p)),
                  bytes);
        EXPECT_EQ(dout.get(bytes), want) << "the fused hop";
        std::vector<float> sum(acc.size(), -1.0f);
        cpu.decompress_accumulate(msg.data(), bytes, h, plan, blk, sum.data());
        gpu->decompress_accumulate(static_cast<const uint8_t*>(din.p), bytes, d, plan, blk,
                                   static_cast<float*>(dsum.p));
        const std::vector<uint8_t> got = dsum.get(acc.size() * 4);
        const size_t n_valid = size_t(std::min<int64_t>(blk.w1 * plan.unit, numel) - blk.w0 * plan.unit) * 4;
        EXPECT_EQ(std::memcmp(got.data(), sum.data(), n_valid), 0) << "decompress_accumulate";
        // the reduce-scatter sink: y <- store((x + decompress(msg)) / divisor), the rest of y untouched
        for (float divisor : {1.0f, 3.0f}) {
          std::vector<uint8_t> hy(x.size(), 0xA5);
          dy.put(hy.data(), hy.size());
          Output yh, yd;
          yh.bucket = hy.data();
          yh.divisor = yd.divisor = divisor;
          yd.bucket = dy.p;
          cpu.decompress_accumulate_output(msg.data(), bytes, h, plan, blk, yh);
          ASSERT_NE(hy, std::vector<uint8_t>(x.size(), 0xA5)) << "the host's sink wrote nothing";
          gpu->decompress_accumulate_output(static_cast<const uint8_t*>(din.p), bytes, d, plan, blk, yd);
          EXPECT_EQ(dy.get(x.size()), hy) << "decompress_accumulate_output, divisor " << divisor;
        }
      }
      for (float divisor : {1.0f, 3.0f}) {
        std::vector<uint8_t> hy(x.size(), 0xA5);
        dy.put(hy.data(), hy.size());
        Output yh, yd;
        yh.bucket = hy.data();
        yh.divisor = yd.divisor = divisor;
        yd.bucket = dy.p;
        cpu.decompress(msg.data(), bytes, plan, blk, yh);
        gpu->decompress(static_cast<const uint8_t*>(din.p), bytes, plan, blk, yd);
        EXPECT_EQ(dy.get(x.size()), hy) << "decompress, divisor " << divisor;
      }
      gpu->finish();
    }
}

}  // namespace
}  // namespace dynamiq
