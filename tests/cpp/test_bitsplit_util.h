// Test-side references for the bit-split codec, written from the documented
// wire layout (csrc/kernels/bitsplit/bitsplit_format.h header comment) and the paper's
// table 4, not from the codec: a message parser and the byte accounting.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/base/float_bits.h"

namespace dynamiq {
namespace bstest {

// FlashCommunication V2, table 4 ("Memory footprint ... of Spike Reserving"):
// n elements quantised to b bits in groups of G:
//   Quantized  = n * b / 8
//   Scale&zero = groups * (scale bytes + zero bytes)
//   Spikes     = groups * 2 * (spike value bytes + spike index bytes)   (spike reserving)
//   Meta = Scale&zero + Spikes,  Total_SR = Quantized + Meta.
struct Table4 {
  int64_t quantized, scale_zero, spikes, meta, total;
};
inline Table4 paper_table4(int64_t n, int bits, int G, bool spikes, int scale_bytes, int zero_bytes,
                           int spike_value_bytes, int spike_index_bytes) {
  const int64_t groups = n / G;
  Table4 t;
  t.quantized = n * bits / 8;
  t.scale_zero = groups * (scale_bytes + zero_bytes);
  t.spikes = spikes ? groups * 2 * (spike_value_bytes + spike_index_bytes) : 0;
  t.meta = t.scale_zero + t.spikes;
  t.total = t.quantized + t.meta;
  return t;
}

// The settings of this codec in table 4's terms: bf16 scale and zero (2 + 2
// bytes) or an integer log scale and zero (1 + 1 bytes), spike values in the
// bucket dtype, uint8 spike indices. A partial last group is padded to G.
inline int64_t accounted_bytes(int64_t numel, int bits, int G, bool spikes, bool log_scales,
                               DType dtype) {
  const int64_t padded = (numel + G - 1) / G * G;
  const int sb = log_scales ? 1 : 2;
  return paper_table4(padded, bits, G, spikes, sb, sb, dtype == DType::kF32 ? 4 : 2, 1).total;
}

// ---- message parser (from the documented layout) -------------------------------

inline std::vector<int> plane_widths(int bits) {
  switch (bits) {
    case 2: return {2};
    case 3: return {2, 1};
    case 4: return {4};
    case 5: return {4, 1};
    case 6: return {4, 2};
    case 7: return {4, 2, 1};
    default: return {8};
  }
}

struct ParsedGroup {
  std::vector<uint32_t> codes;  // G slots
  float scale = 0, zero = 0;
  uint16_t raw0 = 0, raw1 = 0;
  int imin = -1, imax = -1;
  float vmin = 0, vmax = 0;
};

inline uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t rd32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// Reference decode of the log-scale word: bits 0..8 signed k, bits 9..15 signed z;
// scale = 2^(k/10), zero = z * L * scale / 64 (in double).
inline void log_word(uint16_t w, int L, double& scale, double& zero) {
  int k = w & 0x1ff;
  if (k >= 256) k -= 512;
  int z = (w >> 9) & 0x7f;
  if (z >= 64) z -= 128;
  scale = std::pow(2.0, k / 10.0);
  zero = z * L * scale / 64.0;
}

inline std::vector<ParsedGroup> parse_message(const std::vector<uint8_t>& msg, int64_t ng, int bits,
                                              int G, bool spikes, bool log_scales, DType dtype) {
  const std::vector<int> widths = plane_widths(bits);
  std::vector<ParsedGroup> out(static_cast<size_t>(ng));
  for (auto& g : out) g.codes.assign(size_t(G), 0u);
  size_t off = 0;
  int remaining = bits;
  for (int w : widths) {
    remaining -= w;  // this plane's field sits above the later planes
    for (int64_t s = 0; s < ng * G; ++s) {
      const int64_t bit = s * w;
      const uint32_t byte = msg.at(off + size_t(bit / 8));
      const uint32_t field = (byte >> (bit % 8)) & ((1u << w) - 1u);
      out[size_t(s / G)].codes[size_t(s % G)] |= field << remaining;
    }
    off += size_t(ng * G * w / 8);
  }
  const int vb = dtype == DType::kF32 ? 4 : 2;
  if (spikes) {
    for (int64_t g = 0; g < ng; ++g)
      for (int m = 0; m < 2; ++m) {
        const uint8_t* p = &msg.at(off + size_t((2 * g + m) * vb));
        float v = dtype == DType::kF32   ? bits_f32(rd32(p))
                  : dtype == DType::kBF16 ? bf16_to_f32(rd16(p))
                                          : f16_to_f32(rd16(p));
        (m == 0 ? out[size_t(g)].vmin : out[size_t(g)].vmax) = v;
      }
    off += size_t(ng * 2 * vb);
  }
  const int L = (1 << bits) - 1;
  for (int64_t g = 0; g < ng; ++g) {
    auto& pg = out[size_t(g)];
    if (log_scales) {
      pg.raw0 = rd16(&msg.at(off + size_t(2 * g)));
      double s, z;
      log_word(pg.raw0, L, s, z);
      pg.scale = float(s);
      pg.zero = float(z);
    } else {
      pg.raw0 = rd16(&msg.at(off + size_t(4 * g)));
      pg.raw1 = rd16(&msg.at(off + size_t(4 * g + 2)));
      pg.scale = bf16_to_f32(pg.raw0);
      pg.zero = bf16_to_f32(pg.raw1);
    }
  }
  off += size_t(ng * (log_scales ? 2 : 4));
  if (spikes) {
    for (int64_t g = 0; g < ng; ++g) {
      out[size_t(g)].imin = msg.at(off + size_t(2 * g));
      out[size_t(g)].imax = msg.at(off + size_t(2 * g + 1));
    }
    off += size_t(ng * 2);
  }
  EXPECT_EQ(off, msg.size()) << "parsed sections do not cover the message";
  return out;
}

// ---- running the codec on a whole bucket as one block ------------------------------

struct Bucket {
  DType dtype = DType::kF32;
  std::vector<float> f32;
  std::vector<uint16_t> h16;
  int64_t numel() const { return dtype == DType::kF32 ? int64_t(f32.size()) : int64_t(h16.size()); }
  const void* data() const {
    return dtype == DType::kF32 ? static_cast<const void*>(f32.data()) : h16.data();
  }
  void* data() { return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : h16.data(); }
  float at(int64_t i) const {
    switch (dtype) {
      case DType::kF32: return f32[size_t(i)];
      case DType::kBF16: return bf16_to_f32(h16[size_t(i)]);
      default: return f16_to_f32(h16[size_t(i)]);
    }
  }
  // The bucket's values, rounded to its dtype.
  std::vector<float> values() const {
    std::vector<float> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[size_t(i)] = at(i);
    return v;
  }
};

inline Bucket make_bucket(DType dt, const std::vector<float>& v) {
  Bucket b;
  b.dtype = dt;
  if (dt == DType::kF32) {
    b.f32 = v;
  } else {
    b.h16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      b.h16[i] = dt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  }
  return b;
}

inline RngCtx rng_ctx(uint64_t seed, uint64_t seq, int rank, bool stochastic) {
  RngCtx r;
  r.key = make_rng_key(seed, seq);
  r.rank = rank;
  r.stochastic = stochastic;
  return r;
}

inline std::vector<uint8_t> compress_all(const BitsplitCodec& c, const Bucket& b, const RngCtx& rng) {
  Plan plan = c.make_plan(b.dtype, b.numel(), 1);
  Block blk{0, plan.num_units};
  std::vector<uint8_t> out(c.static_bytes(plan, blk));
  Local x;
  x.bucket = b.data();
  const size_t n = c.compress(x, plan, blk, rng, out.data());
  EXPECT_EQ(n, out.size());
  return out;
}

// Decompressed values (rounded to the bucket dtype, as decompress stores them).
inline std::vector<float> decompress_all(const BitsplitCodec& c, DType dt, int64_t numel,
                                         const std::vector<uint8_t>& msg) {
  Plan plan = c.make_plan(dt, numel, 1);
  Block blk{0, plan.num_units};
  Bucket y = make_bucket(dt, std::vector<float>(size_t(numel), 0.0f));
  Output o;
  o.bucket = y.data();
  c.decompress(msg.data(), msg.size(), plan, blk, o);
  return y.values();
}

inline double vnmse(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return num / den;
}

inline std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = d(g);
  return v;
}

}  // namespace bstest
}  // namespace dynamiq
