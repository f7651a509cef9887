// Helpers shared by the DynamiQ codec tests: data generators (independent of
// the codec's Philox), whole-bucket compress/decompress, and an independent
// decoder written from the wire-format comment in dynamiq_codec.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/base/cpu_isa.h"
#include "kernels/base/float_bits.h"
#include "kernels/dynamiq/dynamiq_codec.h"

namespace dynamiq {
namespace dqtest {

// A plan of numel values under fmt whose super-groups cycle through every width
// (unit u: kDynamiqWidths[3u mod 5]) with biases 0, 0.1, 0.2, 0.3, the units
// ordered widest first as the allocator orders them: every SG shape a block
// can hold, on one rank.
inline Plan mixed_width_plan(DType dt, int64_t numel, const DynamiqFormat& fmt) {
  const int64_t units = (numel + fmt.S - 1) / fmt.S;
  std::vector<uint8_t> bits(static_cast<size_t>(units));
  std::vector<float> bias(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u) {
    bits[size_t(u)] = uint8_t(kDynamiqWidths[(u * 3) % 5]);
    bias[size_t(u)] = 0.1f * float(u % 4);
  }
  std::vector<int32_t> order(static_cast<size_t>(units));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bits[size_t(a)] > bits[size_t(b)]; });
  return make_dynamiq_plan(dt, numel, fmt, bits, order, bias, 1);
}

inline std::vector<float> gaussian(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = float(d(g));
  return x;
}

// n ranks' buckets in dtype dt (float32, bf16 or fp16): Gaussian + 0.25 (not centred, so every
// mode compresses them), rank r's seeded by seed_base * n + r.
inline std::vector<std::vector<uint8_t>> shifted_gaussian_buckets(int n, DType dt, int64_t numel, uint64_t seed_base) {
  std::vector<std::vector<uint8_t>> input(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::vector<float> v = gaussian(size_t(numel), seed_base * uint64_t(n) + uint64_t(r));
    auto& b = input[size_t(r)];
    b.resize(size_t(numel) * size_t(dtype_size(dt)));
    for (int64_t i = 0; i < numel; ++i) {
      const float x = v[size_t(i)] + 0.25f;
      if (dt == DType::kF32) {
        std::memcpy(b.data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = dt == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
        std::memcpy(b.data() + 2 * i, &h, 2);
      }
    }
  }
  return input;
}

// Student-t with 3 degrees of freedom: Z / sqrt(chi2_3 / 3).
inline std::vector<float> student_t3(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> z(0.0, 1.0);
  std::chi_squared_distribution<double> c(3.0);
  std::vector<float> x(n);
  for (auto& v : x) v = float(z(g) / std::sqrt(c(g) / 3.0));
  return x;
}

// The CPU kernel ISAs this machine can run: the build's baseline always
// ("avx2", or "generic" in the portable build), "avx512" when the CPU has
// F/BW/DQ/VL.
inline std::vector<std::string> available_cpu_isas() {
  const std::string before = dynamiq_set_cpu_isa("auto");
  const std::string isa = dynamiq_cpu_isa();
  std::vector<std::string> v{isa == "avx512" ? std::string("avx2") : isa};
  if (isa == "avx512") v.push_back("avx512");
  dynamiq_set_cpu_isa(before);
  return v;
}

// Runs the kernels under one ISA for the scope's lifetime.
struct IsaScope {
  std::string before;
  explicit IsaScope(const std::string& isa) : before(dynamiq_set_cpu_isa(isa)) {}
  ~IsaScope() { dynamiq_set_cpu_isa(before); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

inline RngCtx rng_ctx(uint64_t seed, uint64_t seq, int rank = 0, int world = 1, bool corr = true) {
  RngCtx r;
  r.key = make_rng_key(seed, seq);
  r.rank = rank;
  r.world = world;
  r.correlated = corr;
  r.stochastic = true;
  return r;
}

// A plan of one chunk with the same width for every SG (or `widths` per SG).
inline Plan uniform_plan(int64_t numel, int width, const DynamiqFormat& f = DynamiqFormat(),
                         DType dt = DType::kF32) {
  const int64_t units = ceil_div<int64_t>(numel, f.S);
  return make_dynamiq_plan(dt, numel, f, std::vector<uint8_t>(size_t(units), uint8_t(width)), {},
                           {}, 1);
}

inline Block whole(const Plan& p) { return Block{0, p.num_units}; }

inline std::vector<uint8_t> compress_bucket(const DynamiqCodec& c, const Plan& p, const void* bucket,
                                            const RngCtx& r) {
  std::vector<uint8_t> out(c.static_bytes(p, whole(p)) + 1);
  Local x;
  x.bucket = bucket;
  const size_t n = c.compress(x, p, whole(p), r, out.data());
  out.resize(n);
  return out;
}

// Decoded values in float, wire order = source order required (no reordering),
// before any output rounding: decompress_accumulate onto zeros.
inline std::vector<float> decode_f32(const DynamiqCodec& c, const Plan& p,
                                     const std::vector<uint8_t>& bytes) {
  std::vector<float> zeros(size_t(p.num_units * p.unit), 0.0f), acc(zeros.size());
  Local z;
  z.acc = zeros.data();
  z.acc_w0 = 0;
  c.decompress_accumulate(bytes.data(), bytes.size(), z, p, whole(p), acc.data());
  // back to source order
  std::vector<float> out(size_t(p.numel));
  for (int64_t w = 0; w < p.num_units; ++w) {
    const int64_t s = p.src_unit(w);
    for (int64_t i = 0; i < p.unit_elem_count(s); ++i)
      out[size_t(s * p.unit + i)] = acc[size_t(w * p.unit + i)];
  }
  return out;
}

// Final values through decompress (store_unit semantics) into an fp32 bucket.
inline std::vector<float> decompress_f32(const DynamiqCodec& c, const Plan& p,
                                         const std::vector<uint8_t>& bytes, float bias_scale = 1.0f,
                                         float divisor = 1.0f) {
  std::vector<float> out(size_t(p.numel), -12345.0f);
  Output y;
  y.bucket = out.data();
  y.bias_scale = bias_scale;
  y.divisor = divisor;
  c.decompress(bytes.data(), bytes.size(), p, whole(p), y);
  return out;
}

// Levels written directly from the paper's formula, in double.
inline std::vector<double> paper_levels(int b, double eps, bool uniform) {
  const int m = (1 << (b - 1)) - 1;
  std::vector<double> L(size_t(m) + 1);
  const double c = 1.0 + 2.0 * eps * eps;
  for (int r = 0; r <= m; ++r)
    L[size_t(r)] = (uniform || eps == 0.0) ? double(r) / m : (std::pow(c, r) - 1.0) / (std::pow(c, m) - 1.0);
  return L;
}

inline float bf16_le(const uint8_t* p) { return bf16_to_f32(uint16_t(p[0] | (p[1] << 8))); }

// Independent decoder of one block (no reordering), from the format comment.
inline std::vector<double> oracle_decode(const std::vector<uint8_t>& bytes, const Plan& p,
                                         const DynamiqParams& prm) {
  const DynamiqFormat& f = prm.fmt;
  const int S = f.S, G = S / f.s;
  std::vector<double> out(size_t(p.num_units) * size_t(S));
  size_t off = 0;
  for (int64_t w = 0; w < p.num_units; ++w) {
    const int b = p.bits[size_t(p.src_unit(w))];
    const uint8_t* sg = bytes.data() + off;
    double* o = out.data() + w * S;
    if (b == 16) {
      for (int i = 0; i < S; ++i) o[i] = bf16_le(sg + 2 * i);
      off += size_t(2 * S);
      continue;
    }
    std::vector<double> scale(static_cast<size_t>(G));
    const uint8_t* codes;
    if (f.hierarchical) {
      const double Msg = bf16_le(sg);
      for (int k = 0; k < G; ++k) scale[size_t(k)] = double(float(sg[2 + k] / 255.0)) * Msg;
      codes = sg + 2 + G;
    } else {
      for (int k = 0; k < G; ++k) scale[size_t(k)] = bf16_le(sg + 2 * k);
      codes = sg + 2 * G;
    }
    const int nb = S * b / 8;
    const int wi = b == 1 ? 0 : b == 2 ? 1 : b == 4 ? 2 : 3;
    std::vector<double> L;
    if (b > 1) L = paper_levels(b, prm.eps[size_t(wi)], prm.uniform_levels);
    for (int i = 0; i < S; ++i) {
      const uint32_t code = (codes[i % nb] >> ((i / nb) * b)) & ((1u << b) - 1u);
      double v;
      if (b == 1) {
        v = code ? 1.0 : -1.0;
      } else {
        const uint32_t idx = code & ((1u << (b - 1)) - 1u);
        v = (code >> (b - 1)) ? -L[idx] : L[idx];
      }
      o[i] = v * scale[size_t(i / f.s)];
    }
    off += size_t(dynamiq_sg_bytes(b, f));
  }
  return out;
}

}  // namespace dqtest
}  // namespace dynamiq
