// GPU kernels of the DynamiQ codec against the CPU codec: bit-identical bytes
// (compress, fused) and values (decompress, decompress_accumulate, stats) on
// mixed widths, every dtype, correlated (table and swap-or-not) and
// independent rounding, both scale roundings. With nvcc it runs on a GPU and
// skips when none is present; CI runs it on the CPU emulation of CUDA
// (tests/cpp/cuda_emu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dynamiq/cuda/dynamiq_kernels.h"
#include "kernels/dynamiq/dynamiq_stats.h"

namespace dynamiq {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
T* to_dev(const std::vector<T>& v) {
  T* d = nullptr;
  const size_t bytes = std::max<size_t>(1, v.size() * sizeof(T));
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), bytes), cudaSuccess);
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return d;
}

// Element i of a bucket of dtype dt, as a float.
float value_at(DType dt, const uint8_t* bucket, int64_t i) {
  if (dt == DType::kF32) {
    float v;
    std::memcpy(&v, bucket + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, bucket + 2 * i, 2);
  return dt == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

template <typename T>
std::vector<T> from_dev(const T* d, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Every kernel on the GPU against the CPU codec for one configuration: the
// bytes of compress and the fused hop, the values of decompress (with bias and
// divisor), decompress_accumulate and the statistics. `value(i)` gives the data.
template <typename F>
void check_against_cpu(DType dt, bool stoch_scales, int world, int64_t numel, std::mt19937& g, F value) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " world " + std::to_string(world) + " numel " +
               std::to_string(numel) + (stoch_scales ? " stochastic scales" : ""));
  DynamiqParams prm;
  prm.stochastic_group_scales = stoch_scales;
  DynamiqCodec codec(prm);
  cuda::DeviceTables dtab(codec.tables());
  const int64_t units = ceil_div<int64_t>(numel, 256);
  std::vector<uint8_t> bits;
  std::vector<float> bias;
  for (int64_t u = 0; u < units; ++u) {
    bits.push_back(uint8_t(kDynamiqWidths[g() % 5]));
    bias.push_back(float(int(g() % 21) - 10) * 0.05f);
  }
  std::vector<int32_t> order(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u) order[size_t(u)] = int32_t(u);
  std::shuffle(order.begin(), order.end(), g);
  Plan plan = make_dynamiq_plan(dt, numel, prm.fmt, bits, order, bias, 1);
  std::vector<uint8_t> bucket(size_t(numel) * size_t(dtype_size(dt)));
  for (int64_t i = 0; i < numel; ++i) {
    const float v = value(i);
    if (dt == DType::kF32) std::memcpy(bucket.data() + 4 * i, &v, 4);
    else {
      const uint16_t h = dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(bucket.data() + 2 * i, &h, 2);
    }
  }
  RngCtx rng;
  rng.key = make_rng_key(42, 7);
  rng.world = world;
  rng.rank = world - 1;
  rng.correlated = true;
  const Block all{0, units};
  const size_t nbytes = codec.static_bytes(plan, all);
  // CPU
  Local lx;
  lx.bucket = bucket.data();
  std::vector<uint8_t> c_cpu(nbytes), f_cpu(nbytes);
  codec.compress(lx, plan, all, rng, c_cpu.data());
  codec.decompress_accumulate_recompress(c_cpu.data(), nbytes, lx, plan, all, rng, f_cpu.data());
  std::vector<float> acc_cpu(size_t(units) * 256);
  codec.decompress_accumulate(c_cpu.data(), nbytes, lx, plan, all, acc_cpu.data());
  std::vector<uint8_t> out_cpu(bucket.size());
  Output y;
  y.bucket = out_cpu.data();
  y.bias_scale = 3.0f;
  y.divisor = 3.0f;
  codec.decompress(f_cpu.data(), nbytes, plan, all, y);
  // GPU
  cuda::DevicePlan dp;
  dp.dtype = dt;
  dp.numel = numel;
  dp.unit = 256;
  dp.num_units = units;
  dp.order = to_dev(plan.order);
  dp.bits = to_dev(plan.bits);
  dp.bias = to_dev(plan.bias);
  dp.wire_offset = to_dev(plan.wire_offset);
  uint8_t* d_bucket = to_dev(bucket);
  uint8_t* d_c = to_dev(std::vector<uint8_t>(nbytes));
  uint8_t* d_f = to_dev(std::vector<uint8_t>(nbytes));
  float* d_acc = to_dev(std::vector<float>(size_t(units) * 256));
  uint8_t* d_out = to_dev(std::vector<uint8_t>(bucket.size()));
  cuda::DeviceLocal dl;
  dl.bucket = d_bucket;
  const DqRounding rd = dtab.rounding(rng);
  ASSERT_EQ(cuda::compress(prm, dtab.view(), dp, dl, 0, units, rd, d_c, nullptr), 0);
  ASSERT_EQ(cuda::decompress_accumulate_recompress(prm, dtab.view(), dp, d_c, dl, 0, units, rd, d_f, nullptr), 0);
  ASSERT_EQ(cuda::decompress_accumulate(prm, dtab.view(), dp, d_c, dl, 0, units, d_acc, nullptr), 0);
  cuda::DeviceOutput dy;
  dy.bucket = d_out;
  dy.bias_scale = 3.0f;
  dy.divisor = 3.0f;
  ASSERT_EQ(cuda::decompress(prm, dtab.view(), dp, d_f, 0, units, dy, nullptr), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Super-groups holding an inf or NaN (which the driver never sends through a
  // lossy codec: such buckets take the exact path) give non-finite values, but
  // their bits are not portable: a GPU makes every NaN 0x7fffffff, x86 keeps a
  // NaN's sign and payload and makes 0xffc00000 from inf * 0. There the bytes
  // are not compared and a value must be NaN on both or bit-identical.
  std::vector<uint8_t> bad_unit(size_t(units), 0);
  for (int64_t i = 0; i < numel; ++i) {
    if (!std::isfinite(value_at(dt, bucket.data(), i))) bad_unit[size_t(i / 256)] = 1;
  }
  auto compare_bytes = [&](const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu, const char* what) {
    ASSERT_EQ(gpu.size(), cpu.size());
    for (int64_t k = 0; k < units; ++k) {  // wire position k carries source unit order[k]
      if (bad_unit[size_t(plan.order[size_t(k)])]) continue;
      const size_t a = size_t(plan.wire_offset[size_t(k)]), b = size_t(plan.wire_offset[size_t(k) + 1]);
      EXPECT_TRUE(std::equal(gpu.begin() + long(a), gpu.begin() + long(b), cpu.begin() + long(a)))
          << what << ": super-group at wire position " << k;
    }
  };
  auto same_value = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || f32_bits(a) == f32_bits(b); };
  compare_bytes(from_dev(d_c, nbytes), c_cpu, "compress");
  compare_bytes(from_dev(d_f, nbytes), f_cpu, "fused");
  const auto acc_gpu = from_dev(d_acc, acc_cpu.size());
  for (size_t e = 0; e < acc_cpu.size(); ++e) {  // acc is in wire order, 256 per super-group
    const bool bad = bad_unit[size_t(plan.order[e / 256])];
    if (bad ? !same_value(acc_gpu[e], acc_cpu[e]) : f32_bits(acc_gpu[e]) != f32_bits(acc_cpu[e])) {
      ADD_FAILURE() << "decompress_accumulate differs at " << e;
      break;
    }
  }
  const auto out_gpu = from_dev(d_out, out_cpu.size());
  for (int64_t i = 0; i < numel; ++i) {
    const size_t es = size_t(dtype_size(dt));
    const uint8_t* pg = out_gpu.data() + es * size_t(i);
    const uint8_t* pc = out_cpu.data() + es * size_t(i);
    if (bad_unit[size_t(i / 256)] ? !same_value(value_at(dt, out_gpu.data(), i), value_at(dt, out_cpu.data(), i))
                                  : std::memcmp(pg, pc, es) != 0) {
      ADD_FAILURE() << "decompress differs at element " << i;
      break;
    }
  }
  // stats
  std::vector<float> st_cpu(size_t(2 * units));
  const bool bad_cpu = dynamiq_local_stats(bucket.data(), dt, numel, 256, st_cpu.data());
  float* d_st = to_dev(std::vector<float>(st_cpu.size()));
  uint32_t* d_bad = to_dev(std::vector<uint32_t>(1, 0));
  ASSERT_EQ(cuda::stats(d_bucket, dt, numel, 256, d_st, d_bad, nullptr), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto st_gpu = from_dev(d_st, st_cpu.size());
  EXPECT_EQ(0, std::memcmp(st_gpu.data(), st_cpu.data(), st_cpu.size() * 4)) << "stats";
  EXPECT_EQ(from_dev(d_bad, 1)[0] != 0, bad_cpu);
  for (void* p : {(void*)dp.order, (void*)dp.bits, (void*)dp.bias, (void*)dp.wire_offset, (void*)d_bucket,
                  (void*)d_c, (void*)d_f, (void*)d_acc, (void*)d_out, (void*)d_st, (void*)d_bad})
    cudaFree(p);
}

TEST(CudaDynamiq, KernelsBitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (bool stoch_scales : {false, true})
      for (int world : {1, 2, 5, 11})
        check_against_cpu(dt, stoch_scales, world, 256 * 40 + 77, g, [&](int64_t) { return nd(g); });
}

// The edge data of the CPU codec's round-trip tests, on the GPU: zeros, a
// constant, one huge outlier, denormals, an inf and a nan (the exact path of a
// super-group), less than one super-group and exact multiples of it.
TEST(CudaDynamiq, EdgeDataBitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t numel : {int64_t(5), int64_t(256 * 3), int64_t(256 * 6 + 17)}) {
      check_against_cpu(dt, false, 4, numel, g, [](int64_t) { return 0.0f; });
      check_against_cpu(dt, false, 4, numel, g, [](int64_t) { return -0.75f; });
      check_against_cpu(dt, false, 4, numel, g, [&](int64_t i) { return i == 3 ? 1e30f : nd(g); });
      check_against_cpu(dt, true, 3, numel, g, [&](int64_t) { return nd(g) * 1e-39f; });
      check_against_cpu(dt, false, 9, numel, g, [&](int64_t i) { return i == 1 ? inf : i == 300 ? nan : nd(g); });
    }
}

// An empty range launches nothing (a grid of zero blocks is an invalid
// configuration on a GPU) and reports success, like the CPU codec.
TEST(CudaDynamiq, EmptyRangesLaunchNothing) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DynamiqParams prm;
  DynamiqCodec codec(prm);
  cuda::DeviceTables dtab(codec.tables());
  const std::vector<uint8_t> bits(4, 4);
  const std::vector<int32_t> order{0, 1, 2, 3};
  const std::vector<float> bias(4, 0.0f);
  Plan plan = make_dynamiq_plan(DType::kF32, 1024, prm.fmt, bits, order, bias, 1);
  cuda::DevicePlan dp;
  dp.numel = 1024;
  dp.num_units = 4;
  dp.bits = to_dev(plan.bits);
  dp.wire_offset = to_dev(plan.wire_offset);
  RngCtx rng;
  const DqRounding rd = dtab.rounding(rng);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cuda::compress(prm, dtab.view(), dp, cuda::DeviceLocal(), 2, 2, rd, nullptr, nullptr), 0);
  EXPECT_EQ(cuda::decompress(prm, dtab.view(), dp, nullptr, 3, 3, cuda::DeviceOutput(), nullptr), 0);
  EXPECT_EQ(cuda::decompress_accumulate(prm, dtab.view(), dp, nullptr, cuda::DeviceLocal(), 4, 4, nullptr, nullptr), 0);
  EXPECT_EQ(cuda::decompress_accumulate_recompress(prm, dtab.view(), dp, nullptr, cuda::DeviceLocal(), 0, 0, rd,
                                                   nullptr, nullptr),
            0);
  EXPECT_EQ(cuda::stats(nullptr, DType::kF32, 0, 256, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(const_cast<uint8_t*>(dp.bits));
  cudaFree(const_cast<int64_t*>(dp.wire_offset));
}

}  // namespace
}  // namespace dynamiq
