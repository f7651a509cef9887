// The CUDA ZipCCL decoder's per-segment escape check (lossless_decode_kernels.cu, zip_segment_warp), as
// tests/cpp/test_lossless_escapes.cc checks the CPU one: a segment announcing one escape more
// than its codes use (one code-plane bit flipped, escape -> code 1) passes lossless_parse and
// must still be refused by lossless_decode_cuda (a kCodes fault). Runs on a GPU, and in CI
// on the CPU emulation of CUDA (tests/cpp/cuda_emu).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/base/float_bits.h"
#include "kernels/lossless/lossless_cuda.h"
#include "cuda_lossless_device_decode.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(CudaLosslessEscapes, SegmentAnnouncingMoreEscapesThanItsCodesUseIsMalformed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const DType t = DType::kBF16;
  const int64_t n = 3000;  // 375 groups, 3 segments
  std::mt19937 g(9);
  std::uniform_real_distribution<float> u(1.0f, 500.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = f32_to_bf16(i % 97 == 5 ? 1e-30f : u(g));
  std::vector<uint8_t> msg(lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n));
  LosslessOptions opt;
  opt.formats = (1u << 0) | (1u << 2);  // plain or zip
  msg.resize(lossless_encode(v.data(), t, n, msg.data(), opt));
  LosslessDecodePlan dp;
  lossless_parse(msg.data(), msg.size(), t, n, dp);
  ASSERT_EQ(dp.format, lossless::ExpFormat::kZip);
  const int64_t G = dp.layout.groups;
  const size_t planes = lossless_static_bytes(t, n) + size_t(dp.planes_offset);
  for (int64_t seg = 0; seg < dp.layout.segments; ++seg) {
    // the segment's first escaped value (all three code bits 0)
    int64_t esc = -1;
    for (int64_t i = seg * lossless::kSegment; i < std::min<int64_t>(dp.layout.body, (seg + 1) * lossless::kSegment) && esc < 0; ++i) {
      int c = 0;
      for (int k = 0; k < 3; ++k) c |= ((msg[planes + size_t(k * G + i / 8)] >> (i % 8)) & 1) << k;
      if (c == 0) esc = i;
    }
    ASSERT_GE(esc, 0) << "segment " << seg;
    std::vector<uint8_t> bad = msg;
    bad[planes + size_t(esc / 8)] ^= uint8_t(1u << (esc % 8));  // escape -> code 1
    LosslessDecodePlan bp;
    ASSERT_NO_THROW(lossless_parse(bad.data(), bad.size(), t, n, bp));
    uint8_t *dmsg = nullptr, *dy = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dmsg), bad.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dy), size_t(n) * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dmsg, bad.data(), bad.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(dqtest::decode_on_device(t, dmsg, bad.size(), n, dy).kind, lossless::FaultKind::kCodes)
        << "segment " << seg;
    // the unflipped message decodes on the device
    ASSERT_EQ(cudaMemcpy(dmsg, msg.data(), msg.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(dqtest::decode_on_device(t, dmsg, msg.size(), n, dy).kind, lossless::FaultKind::kNone);
    std::vector<uint16_t> y(static_cast<size_t>(n));
    ASSERT_EQ(cudaMemcpy(y.data(), dy, size_t(n) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(y, v);
    cudaFree(dmsg);
    cudaFree(dy);
  }
}

}  // namespace
}  // namespace dynamiq
