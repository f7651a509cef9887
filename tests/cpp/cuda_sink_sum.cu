// The reduce-scatter sink's codec call, Codec::decompress_accumulate_output
// (y <- x + decompress(in), written as output values), on every CUDA codec
// (DynamiqCudaCodec, BitsplitCudaCodec, IdentityCudaCodec, LosslessCudaCodec)
// against its CPU codec, bit for bit: fp32 and bf16, sum and a mean over 3,
// the local values from the bucket and from a float accumulator, a block in
// the middle of the bucket (dynamiq: mixed widths, a wire order and a bias,
// formats of both kernel shapes).
// The driver takes this call for the lossy modes only (ExecArgs::sink_writes_sum);
// tests/cpp/cuda_collective.cu runs it there through the reduce-scatter.
// With nvcc it runs on a GPU and skips without one; CI runs it on the CPU
// emulation of CUDA (tests/cpp/cuda_emu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/bitsplit/cuda/bitsplit_cuda_codec.h"
#include "kernels/dynamiq/cuda/dynamiq_cuda_codec.h"
#include "kernels/identity/cuda/identity_cuda_codec.h"
#include "kernels/lossless/cuda/lossless_cuda_codec.h"
#include "kernels/lossless/lossless_codec.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <class T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(1, v.size() * sizeof(T))), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// One codec pair on one plan: a message compressed by the CPU codec from
// bucket x0, then the sink call with local bucket x1 (or x1's block as a float
// accumulator) on both codecs; the outputs must match byte for byte and change
// the block only.
void check_pair(const Codec& cpu, const Codec& gpu, const Plan& plan, const std::string& what) {
  SCOPED_TRACE(what);
  const DType dt = plan.dtype;
  const int64_t es = dtype_size(dt), numel = plan.numel;
  const auto in = dqtest::shifted_gaussian_buckets(2, dt, numel, 31);
  const Block b{plan.num_units / 3, plan.num_units - plan.num_units / 4};
  ASSERT_FALSE(b.empty());
  Local x0;
  x0.bucket = in[0].data();
  std::vector<uint8_t> msg(cpu.max_message_bytes(plan, b));
  msg.resize(cpu.compress(x0, plan, b, dqtest::rng_ctx(5, 6), msg.data()));
  // the block's local values of rank 1 as a float accumulator in wire order
  std::vector<float> acc(static_cast<size_t>(b.units() * plan.unit));
  cpu.decompress_accumulate(msg.data(), msg.size(), x0, plan, b, acc.data());  // any floats will do
  for (const bool from_acc : {false, true})
    for (const float divisor : {1.0f, 3.0f}) {
      SCOPED_TRACE(std::string(from_acc ? "accumulator" : "bucket") + " divisor " + std::to_string(divisor));
      std::vector<uint8_t> want(size_t(numel * es), 0xA5), got(size_t(numel * es), 0);
      Local xh;
      if (from_acc) {
        xh.acc = acc.data();
        xh.acc_w0 = b.w0;
      } else {
        xh.bucket = in[1].data();
      }
      Output yh;
      yh.bucket = want.data();
      yh.bias_scale = 2.0f;
      yh.divisor = divisor;
      cpu.decompress_accumulate_output(msg.data(), msg.size(), xh, plan, b, yh);

      uint8_t* d_msg = upload(msg);
      uint8_t* d_bucket = upload(in[1]);
      float* d_acc = upload(acc);
      uint8_t* d_y = upload(std::vector<uint8_t>(size_t(numel * es), 0xA5));
      Local xd;
      if (from_acc) {
        xd.acc = d_acc;
        xd.acc_w0 = b.w0;
      } else {
        xd.bucket = d_bucket;
      }
      Output yd = yh;
      yd.bucket = d_y;
      gpu.decompress_accumulate_output(d_msg, msg.size(), xd, plan, b, yd);
      gpu.finish();
      ASSERT_EQ(cudaMemcpy(got.data(), d_y, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (void* p : {static_cast<void*>(d_msg), static_cast<void*>(d_bucket), static_cast<void*>(d_acc),
                      static_cast<void*>(d_y)})
        cudaFree(p);
      EXPECT_EQ(got, want);
      // only the block's elements were written
      int64_t written = 0;
      for (int64_t w = b.w0; w < b.w1; ++w) written += plan.unit_elem_count(plan.src_unit(w));
      int64_t changed = 0;
      for (int64_t e = 0; e < numel; ++e)
        changed += std::any_of(want.begin() + e * es, want.begin() + (e + 1) * es, [](uint8_t v) { return v != 0xA5; });
      EXPECT_LE(changed, written);
      EXPECT_GT(changed, written / 2);
    }
}

TEST(CudaSinkSum, EveryCudaCodecWritesTheCpuCodecsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string d = dtype_name(dt);
    // dynamiq: mixed widths in a wire order, a bias per super-group, a partial last one; the
    // default format and others of both kernel shapes (warp path: a warp per super-group at
    // S = 256, several per warp at S = 64, flat scales; block path: S = 512, s = 4, S = 24)
    const DynamiqFormat formats[] = {{256, 16, true}, {64, 8, true}, {128, 16, false},
                                     {512, 16, true}, {256, 4, true}, {24, 3, true}};
    for (const DynamiqFormat& fmt : formats) {
      DynamiqParams prm;
      prm.fmt = fmt;
      const Plan plan = dqtest::mixed_width_plan(dt, int64_t(fmt.S) * 12 + 5, prm.fmt);
      check_pair(DynamiqCodec(prm), cuda::DynamiqCudaCodec(prm), plan,
                 "dynamiq S " + std::to_string(fmt.S) + " s " + std::to_string(fmt.s) + " " + d);
    }
    for (const BitsplitParams& prm : {BitsplitParams{2, 32, true, false}, BitsplitParams{5, 128, false, true}}) {
      const BitsplitCodec cpu(prm);
      check_pair(cpu, cuda::BitsplitCudaCodec(prm), cpu.make_plan(dt, 1024 * 5 + 77, 1),
                 "bitsplit " + std::to_string(prm.bits) + " " + d);
    }
    check_pair(IdentityCodec(), cuda::IdentityCudaCodec(), make_identity_plan(dt, 4099, 1), "identity " + d);
    check_pair(LosslessCodec(LosslessOptions()), cuda::LosslessCudaCodec(LosslessOptions()),
               make_lossless_plan(dt, 20013, 1), "lossless " + d);
  }
}

}  // namespace
}  // namespace dynamiq
