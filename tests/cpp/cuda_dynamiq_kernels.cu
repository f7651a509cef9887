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

// What varies besides the data: the format, the block [w0, w1) of wire
// positions (w1 < 0: to the end), and where the buffers start: the bucket and
// the output `elem_off` elements into their allocations, the accumulator
// `elem_off` floats in, the messages `byte_off` bytes in (the kernels load and
// store 16 bytes at a time only where aligned; wire bytes have no alignment).
struct Layout {
  DynamiqFormat fmt;
  bool stoch_scales = false;
  int64_t w0 = 0, w1 = -1;
  int elem_off = 0, byte_off = 0;
};

// Every kernel on the GPU against the CPU codec for one configuration: the
// bytes of compress (from the bucket and from the accumulator) and the fused
// hop, the values of decompress (with bias and divisor),
// decompress_accumulate and the statistics. `value(i)` gives the data.
template <typename F>
void check_layout(DType dt, const Layout& L, int world, int64_t numel, std::mt19937& g, F value) {
  const int S = L.fmt.S;
  SCOPED_TRACE(std::string(dtype_name(dt)) + " world " + std::to_string(world) + " numel " +
               std::to_string(numel) + " S " + std::to_string(S) + " s " + std::to_string(L.fmt.s) +
               (L.fmt.hierarchical ? "" : " flat") + (L.stoch_scales ? " stochastic scales" : "") + " block [" +
               std::to_string(L.w0) + ", " + std::to_string(L.w1) + ") offsets " + std::to_string(L.elem_off) + "/" +
               std::to_string(L.byte_off));
  DynamiqParams prm;
  prm.fmt = L.fmt;
  prm.stochastic_group_scales = L.stoch_scales;
  DynamiqCodec codec(prm);
  cuda::DeviceTables dtab(codec.tables());
  const int64_t units = ceil_div<int64_t>(numel, S);
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
  const size_t es = size_t(dtype_size(dt));
  std::vector<uint8_t> bucket(size_t(numel) * es);
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
  const Block blk{L.w0, L.w1 < 0 ? units : L.w1};
  const int64_t nu = blk.units();
  const size_t nbytes = codec.static_bytes(plan, blk);
  // CPU
  Local lx;
  lx.bucket = bucket.data();
  std::vector<uint8_t> c_cpu(nbytes), f_cpu(nbytes), a_cpu(nbytes);
  codec.compress(lx, plan, blk, rng, c_cpu.data());
  codec.decompress_accumulate_recompress(c_cpu.data(), nbytes, lx, plan, blk, rng, f_cpu.data());
  std::vector<float> acc_cpu(size_t(nu) * size_t(S));
  codec.decompress_accumulate(c_cpu.data(), nbytes, lx, plan, blk, acc_cpu.data());
  Local la;
  la.acc = acc_cpu.data();
  la.acc_w0 = blk.w0;
  codec.compress(la, plan, blk, rng, a_cpu.data());
  std::vector<uint8_t> out_cpu(bucket.size(), 0);
  Output y;
  y.bucket = out_cpu.data();
  y.bias_scale = 3.0f;
  y.divisor = world == 4 ? 4.0f : 3.0f;  // an exact reciprocal, or a division
  codec.decompress(f_cpu.data(), nbytes, plan, blk, y);
  // GPU: every buffer starts the given offset into its allocation
  cuda::DevicePlan dp;
  dp.dtype = dt;
  dp.numel = numel;
  dp.unit = S;
  dp.num_units = units;
  dp.order = to_dev(plan.order);
  dp.bits = to_dev(plan.bits);
  dp.bias = to_dev(plan.bias);
  dp.wire_offset = to_dev(plan.wire_offset);
  const size_t eo = size_t(L.elem_off) * es, bo = size_t(L.byte_off), fo = size_t(L.elem_off) * 4;
  std::vector<uint8_t> bucket_off(eo, 0);
  bucket_off.insert(bucket_off.end(), bucket.begin(), bucket.end());
  uint8_t* d_bucket_a = to_dev(bucket_off);
  uint8_t* d_c_a = to_dev(std::vector<uint8_t>(nbytes + bo));
  uint8_t* d_f_a = to_dev(std::vector<uint8_t>(nbytes + bo));
  uint8_t* d_x_a = to_dev(std::vector<uint8_t>(nbytes + bo));
  uint8_t* d_acc_a = to_dev(std::vector<uint8_t>(acc_cpu.size() * 4 + fo));
  uint8_t* d_out_a = to_dev(std::vector<uint8_t>(bucket.size() + eo, 0));
  uint8_t *d_bucket = d_bucket_a + eo, *d_c = d_c_a + bo, *d_f = d_f_a + bo, *d_x = d_x_a + bo,
          *d_out = d_out_a + eo;
  float* d_acc = reinterpret_cast<float*>(d_acc_a + fo);
  cuda::DeviceLocal dl;
  dl.bucket = d_bucket;
  cuda::DeviceLocal da;
  da.acc = d_acc;
  da.acc_w0 = blk.w0;
  const DqRounding rd = dtab.rounding(rng);
  ASSERT_EQ(cuda::compress(prm, dtab.view(), dp, dl, blk.w0, blk.w1, rd, d_c, nullptr), 0);
  ASSERT_EQ(cuda::decompress_accumulate_recompress(prm, dtab.view(), dp, d_c, dl, blk.w0, blk.w1, rd, d_f, nullptr), 0);
  ASSERT_EQ(cuda::decompress_accumulate(prm, dtab.view(), dp, d_c, dl, blk.w0, blk.w1, d_acc, nullptr), 0);
  ASSERT_EQ(cuda::compress(prm, dtab.view(), dp, da, blk.w0, blk.w1, rd, d_x, nullptr), 0);
  cuda::DeviceOutput dy;
  dy.bucket = d_out;
  dy.bias_scale = y.bias_scale;
  dy.divisor = y.divisor;
  ASSERT_EQ(cuda::decompress(prm, dtab.view(), dp, d_f, blk.w0, blk.w1, dy, nullptr), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Super-groups holding an inf or NaN (which the driver never sends through a
  // lossy codec: such buckets take the exact path) give non-finite values, but
  // their bits are not portable: a GPU makes every NaN 0x7fffffff, x86 keeps a
  // NaN's sign and payload and makes 0xffc00000 from inf * 0. There the bytes
  // are not compared and a value must be NaN on both or bit-identical.
  std::vector<uint8_t> bad_unit(size_t(units), 0);
  for (int64_t i = 0; i < numel; ++i) {
    if (!std::isfinite(value_at(dt, bucket.data(), i))) bad_unit[size_t(i / S)] = 1;
  }
  const int64_t off0 = plan.wire_offset[size_t(blk.w0)];
  auto compare_bytes = [&](const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu, const char* what) {
    ASSERT_EQ(gpu.size(), cpu.size());
    for (int64_t k = blk.w0; k < blk.w1; ++k) {  // wire position k carries source unit order[k]
      if (bad_unit[size_t(plan.order[size_t(k)])]) continue;
      const size_t a = size_t(plan.wire_offset[size_t(k)] - off0), b = size_t(plan.wire_offset[size_t(k) + 1] - off0);
      EXPECT_TRUE(std::equal(gpu.begin() + long(a), gpu.begin() + long(b), cpu.begin() + long(a)))
          << what << ": super-group at wire position " << k;
    }
  };
  auto same_value = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || f32_bits(a) == f32_bits(b); };
  compare_bytes(from_dev(d_c, nbytes), c_cpu, "compress");
  compare_bytes(from_dev(d_f, nbytes), f_cpu, "fused");
  compare_bytes(from_dev(d_x, nbytes), a_cpu, "compress from the accumulator");
  const auto acc_gpu = from_dev(d_acc, acc_cpu.size());
  for (size_t e = 0; e < acc_cpu.size(); ++e) {  // acc is in wire order from w0, S per super-group
    const bool bad = bad_unit[size_t(plan.order[size_t(blk.w0) + e / size_t(S)])];
    if (bad ? !same_value(acc_gpu[e], acc_cpu[e]) : f32_bits(acc_gpu[e]) != f32_bits(acc_cpu[e])) {
      ADD_FAILURE() << "decompress_accumulate differs at " << e;
      break;
    }
  }
  const auto out_gpu = from_dev(d_out, out_cpu.size());
  for (int64_t i = 0; i < numel; ++i) {
    const uint8_t* pg = out_gpu.data() + es * size_t(i);
    const uint8_t* pc = out_cpu.data() + es * size_t(i);
    if (bad_unit[size_t(i / S)] ? !same_value(value_at(dt, out_gpu.data(), i), value_at(dt, out_cpu.data(), i))
                                : std::memcmp(pg, pc, es) != 0) {
      ADD_FAILURE() << "decompress differs at element " << i;
      break;
    }
  }
  // stats
  std::vector<float> st_cpu(size_t(2 * units));
  const bool bad_cpu = dynamiq_local_stats(bucket.data(), dt, numel, S, st_cpu.data());
  float* d_st = to_dev(std::vector<float>(st_cpu.size()));
  uint32_t* d_bad = to_dev(std::vector<uint32_t>(1, 0));
  ASSERT_EQ(cuda::stats(d_bucket, dt, numel, S, d_st, d_bad, nullptr), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto st_gpu = from_dev(d_st, st_cpu.size());
  EXPECT_EQ(0, std::memcmp(st_gpu.data(), st_cpu.data(), st_cpu.size() * 4)) << "stats";
  EXPECT_EQ(from_dev(d_bad, 1)[0] != 0, bad_cpu);
  for (void* p : {(void*)dp.order, (void*)dp.bits, (void*)dp.bias, (void*)dp.wire_offset, (void*)d_bucket_a,
                  (void*)d_c_a, (void*)d_f_a, (void*)d_x_a, (void*)d_acc_a, (void*)d_out_a, (void*)d_st, (void*)d_bad})
    cudaFree(p);
}

// The default format, the whole bucket, aligned buffers.
template <typename F>
void check_against_cpu(DType dt, bool stoch_scales, int world, int64_t numel, std::mt19937& g, F value) {
  Layout L;
  L.stoch_scales = stoch_scales;
  check_layout(dt, L, world, numel, g, value);
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

// Both kernel shapes (README.md, "CUDA kernels") on the formats that select
// them: the warp path with several super-groups per warp (S = 64, 128) and
// groups of 8 up to S values, flat and stochastic scales; the block path for
// S above 256, groups not a multiple of 8 (s = 4, 3, 1) and S/8 not a power
// of two. Buckets end inside an octet (a partial last super-group whose
// values stop mid-vector) and the blocks start and end inside the bucket.
TEST(CudaDynamiq, EveryFormatBitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct F {
    int S, s;
    bool hierarchical, stoch_scales;
  };
  const F formats[] = {{64, 8, true, false},   {128, 32, true, true},   {128, 16, false, false},
                       {256, 8, true, false},  {256, 64, false, false}, {256, 256, true, true},
                       {512, 16, true, false}, {1024, 64, true, true},  {256, 4, true, false},
                       {24, 3, true, false},   {8, 1, false, false},    {200, 8, true, false}};
  for (const F& f : formats)
    for (DType dt : {DType::kF32, DType::kBF16})
      for (int world : {1, 3}) {
        Layout L;
        L.fmt.S = f.S;
        L.fmt.s = f.s;
        L.fmt.hierarchical = f.hierarchical;
        L.stoch_scales = f.stoch_scales;
        const int64_t numel = int64_t(f.S) * 37 + 13;
        L.w0 = 2;
        L.w1 = ceil_div<int64_t>(numel, f.S) - 1;
        check_layout(dt, L, world, numel, g, [&](int64_t) { return nd(g); });
        L.w0 = 5;
        L.w1 = -1;  // to the end: the partial last super-group
        check_layout(dt, L, world, numel, g, [&](int64_t) { return nd(g); });
      }
}

// Buffers that do not start on a 16-byte boundary: the bucket, the output and
// the accumulator 1-4 elements in, the messages 1-8 bytes in. The kernels move
// values in 16-byte accesses only where aligned and wire bytes in the widest
// access the address allows; the bytes and values stay the CPU's.
TEST(CudaDynamiq, MisalignedBuffersBitIdenticalToCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::pair<int, int> offsets[] = {{1, 1}, {2, 2}, {3, 4}, {4, 8}, {0, 3}, {1, 6}};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (auto [eo, bo] : offsets)
      for (int world : {4, 11}) {
        Layout L;
        L.elem_off = eo;
        L.byte_off = bo;
        L.w0 = 1;
        check_layout(dt, L, world, 256 * 21 + 77, g, [&](int64_t) { return nd(g); });
        L.fmt.S = 64;  // several super-groups per warp
        L.fmt.s = 8;
        check_layout(dt, L, world, 64 * 40 + 5, g, [&](int64_t) { return nd(g); });
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
