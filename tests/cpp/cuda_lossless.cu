// The lossless codec's CUDA kernels against the CPU path: the GPU message is
// byte-identical to the CPU one (same split, the host's format choice redone on
// the device, the same per-segment functions) and the GPU decode of a CPU message gives the input bit for bit.
// With nvcc it runs on a GPU and skips when none is present; CI has none and
// runs it on the CPU emulation of CUDA instead (tests/cpp/cuda_emu).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/lossless/lossless_cuda.h"
#include "cuda_lossless_device_decode.h"
#include "lossless_test_values.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), (n ? n : 1) * sizeof(T)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

using dqtest::lossless_values;

TEST(CudaLossless, GpuMessagesAndDecodesMatchTheCpuBitForBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (int kind : {0, 1, 2})
      for (int64_t n : {int64_t(1), int64_t(1001), int64_t(131075)})
        for (uint32_t formats : {0xfu, 0x1u, 0x5u}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " kind " + std::to_string(kind) + " n " +
                       std::to_string(n) + " formats " + std::to_string(formats));
          const auto x = lossless_values(t, n, kind, uint32_t(n + kind));
          LosslessOptions opt;
          opt.formats = formats;
          const size_t cap = lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n);
          std::vector<uint8_t> cpu(cap);
          cpu.resize(lossless_encode(x.data(), t, n, cpu.data(), opt));

          Dev<uint8_t> dx(x.size()), dmsg(cap);
          ASSERT_EQ(cudaMemcpy(dx.p, x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
          // GPU encode: split and histogram, the format choice, sizes, section, header.
          const size_t bytes = dqtest::encode_on_device(t, dx.p, n, dmsg.p, formats);
          std::vector<uint8_t> gpu(bytes);
          ASSERT_EQ(cudaMemcpy(gpu.data(), dmsg.p, gpu.size(), cudaMemcpyDeviceToHost), cudaSuccess);
          EXPECT_EQ(gpu, cpu);

          // GPU decode of the CPU message.
          ASSERT_EQ(cudaMemcpy(dmsg.p, cpu.data(), cpu.size(), cudaMemcpyHostToDevice), cudaSuccess);
          Dev<uint8_t> dy(x.size());
          ASSERT_EQ(dqtest::decode_on_device(t, dmsg.p, cpu.size(), n, dy.p).kind, lossless::FaultKind::kNone);
          std::vector<uint8_t> y(x.size());
          ASSERT_EQ(cudaMemcpy(y.data(), dy.p, y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
          EXPECT_EQ(y, x);
        }
}

TEST(CudaLossless, CorruptHuffmanStreamIsReported) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const DType t = DType::kBF16;
  const int64_t n = 40000;
  const auto x = lossless_values(t, n, 0, 3);
  std::vector<uint8_t> msg(lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n));
  LosslessOptions opt;
  opt.formats = 0x9;
  msg.resize(lossless_encode(x.data(), t, n, msg.data(), opt));
  LosslessDecodePlan dp;
  lossless_parse(msg.data(), msg.size(), t, n, dp);
  ASSERT_EQ(dp.format, lossless::ExpFormat::kHuffman);
  // Flip the last stream byte: the last segment no longer ends where it should
  // (or decodes an invalid code); the header and tables still parse.
  msg.back() ^= 0xff;
  lossless_parse(msg.data(), msg.size(), t, n, dp);
  Dev<uint8_t> dmsg(msg.size());
  ASSERT_EQ(cudaMemcpy(dmsg.p, msg.data(), msg.size(), cudaMemcpyHostToDevice), cudaSuccess);
  bool cpu_threw = false;
  std::vector<uint8_t> y(size_t(n) * 2);
  try {
    lossless_decode(msg.data(), msg.size(), t, n, y.data());
  } catch (const MalformedMessage&) {
    cpu_threw = true;
  }
  Dev<uint8_t> dy(y.size());
  const lossless::Fault f = dqtest::decode_on_device(t, dmsg.p, msg.size(), n, dy.p);
  EXPECT_EQ(f.kind != lossless::FaultKind::kNone, cpu_threw);
  if (cpu_threw) {
    EXPECT_EQ(f.kind, lossless::FaultKind::kCodes);
  }
}

}  // namespace
}  // namespace dynamiq
