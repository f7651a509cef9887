// The device's Philox4x32-10 against philox.h's host words, directly: a kernel draws
// philox4x32_10 (on a GPU built with curand's headers: curand_Philox4x32_10, the device branch
// of philox.h, __umulhi inside) and make_rng_key for a grid of counters and keys, and the host
// compares every word with philox.h's own C++ loop. tests/cpp/curand/test_philox_curand.cc
// compares the host branch of curand's header only; the codecs' stochastic rounding compares
// the device path only through rounded values. On a GPU this is the direct check; on the CPU
// emulation of CUDA (no __CUDA_ARCH__) both sides are the host loop and it checks the harness.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/base/cuda/launch.h"
#include "kernels/base/philox.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// in[i] = (c0, c1, c2, c3, k0, k1); out[i] = the four words, then make_rng_key's two words
// for (seed = c0 | c1 << 32, sequence = c2 | c3 << 32, slice = k0 & 7).
__global__ void philox_words_kernel(const uint32_t* in, uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t* a = in + 6 * i;
  const Philox4x32 w = philox4x32_10(a[0], a[1], a[2], a[3], a[4], a[5]);
  const RngKey k = make_rng_key(uint64_t(a[0]) | (uint64_t(a[1]) << 32), uint64_t(a[2]) | (uint64_t(a[3]) << 32),
                                a[4] & 7u);
  uint32_t* o = out + 6 * i;
  o[0] = w.v[0];
  o[1] = w.v[1];
  o[2] = w.v[2];
  o[3] = w.v[3];
  o[4] = k.k0;
  o[5] = k.k1;
}

TEST(CudaPhiloxDevice, DeviceWordsEqualPhiloxHHostWords) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // corners (all-zero and all-one words, carries in every word) and random counters and keys
  std::vector<uint32_t> in;
  const uint32_t edge[] = {0u, 1u, 0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu};
  for (uint32_t a : edge)
    for (uint32_t b : edge)
      for (uint32_t k : edge) in.insert(in.end(), {a, b, ~a, ~b, k, ~k});
  std::mt19937_64 g(20261128);
  while (in.size() < 6u * 65536u) {
    const uint64_t x = g(), y = g(), z = g();
    in.insert(in.end(), {uint32_t(x), uint32_t(x >> 32), uint32_t(y), uint32_t(y >> 32), uint32_t(z),
                         uint32_t(z >> 32)});
  }
  const int n = int(in.size() / 6);
  uint32_t *d_in = nullptr, *d_out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_in), in.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), in.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  DQ_LAUNCH(philox_words_kernel, unsigned((n + 255) / 256), 256u, 0, nullptr)(d_in, d_out, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<uint32_t> out(in.size());
  ASSERT_EQ(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_in);
  cudaFree(d_out);
  int bad = 0;
  for (int i = 0; i < n && bad < 5; ++i) {
    const uint32_t* a = in.data() + 6 * i;
    const Philox4x32 w = philox4x32_10(a[0], a[1], a[2], a[3], a[4], a[5]);
    const RngKey k = make_rng_key(uint64_t(a[0]) | (uint64_t(a[1]) << 32), uint64_t(a[2]) | (uint64_t(a[3]) << 32),
                                  a[4] & 7u);
    const uint32_t want[6] = {w.v[0], w.v[1], w.v[2], w.v[3], k.k0, k.k1};
    for (int j = 0; j < 6; ++j) {
      if (out[6 * i + j] != want[j]) {
        ADD_FAILURE() << "draw " << i << " word " << j << ": device " << out[6 * i + j] << ", host " << want[j];
        ++bad;
        break;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace dynamiq
