#include "kernels/bitsplit/bitsplit_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/base/unit_io.h"

namespace dynamiq {
namespace {

constexpr int32_t kTargetUnit = 1024;  // elements per plan unit (rounded to whole groups)
constexpr int32_t kMaxUnit = 4096;     // largest unit a plan may use with this codec
// Units per thread below which a call does not split (64 x ~1024 elements, as
// the DynamiQ codec's 256 x 256). Units write disjoint groups of the block
// message (metadata per group, plane bytes per group), so any split gives the
// same bytes. Threads claim runs of 16 units at a time.
constexpr int64_t kMinUnitsPerThread = 64;
constexpr int64_t kUnitsPerRun = 16;

// Everything the unit loops need about one block.
struct BlockCtx {
  BitsplitFormat f;
  BitsplitLayout lay;
  int64_t e0 = 0, e1 = 0;  // element range of the block
  int planes = 1;
  int width[kBitsplitMaxPlanes] = {0, 0, 0};
  int shift[kBitsplitMaxPlanes] = {0, 0, 0};
  int32_t U = 0;
};

BlockCtx make_ctx(const BitsplitFormat& f, const Plan& plan, const Block& b) {
  if (!plan.order.empty() || !plan.bias.empty())
    throw Error("bitsplit codec needs a natural-order plan (no reordering, no bias)");
  if (plan.unit <= 0 || plan.unit % f.group != 0 || plan.unit > kMaxUnit)
    throw Error("bitsplit codec: plan unit " + std::to_string(plan.unit) +
                " is not a multiple of the group size " + std::to_string(f.group) + " (<= " +
                std::to_string(kMaxUnit) + ")");
  if (b.w0 < 0 || b.w1 > plan.num_units) throw Error("bitsplit codec: block outside the plan");
  BlockCtx c;
  c.f = f;
  c.U = plan.unit;
  c.e0 = std::min(b.w0 * plan.unit, plan.numel);
  c.e1 = std::min(std::max(b.w1, b.w0) * plan.unit, plan.numel);
  c.lay = bitsplit_layout(f, ceil_div<int64_t>(c.e1 - c.e0, f.group));
  c.planes = bitsplit_num_planes(f.bits);
  for (int p = 0; p < c.planes; ++p) {
    c.width[p] = bitsplit_plane_width(f.bits, p);
    c.shift[p] = bitsplit_plane_shift(f.bits, p);
  }
  return c;
}

// Scratch of one unit: two float tiles, the uniforms and the codes.
struct Scratch {
  std::vector<float> a, b, u;
  std::vector<uint8_t> codes;
  explicit Scratch(int32_t U) : a(size_t(U)), b(size_t(U)), u(size_t(U)), codes(size_t(U)) {}
};

// Elements of wire position w inside the block (0 past the data).
inline int64_t unit_count(const BlockCtx& c, int64_t w) {
  const int64_t eu = w * c.U;
  return eu >= c.e1 ? 0 : std::min<int64_t>(c.U, c.e1 - eu);
}

// tile[0, U) (zero past the data) -> groups of unit w in the block message.
// In passes over the unit's groups, so that the per-group scalar work (scale
// choice, reciprocal) runs as one vectorised loop across groups.
void encode_unit(const BlockCtx& c, const float* tile, int64_t w, const RngCtx& rng, uint8_t* out,
                 uint8_t* codes, float* u) {
  const int G = c.f.group;
  const int64_t eu = w * c.U;
  const int64_t cnt_u = unit_count(c, w);
  const int ng = int(ceil_div<int64_t>(cnt_u, G));
  const int64_t gi0 = (eu - c.e0) / G;
  constexpr int kMaxGroups = kMaxUnit / kBitsplitMinGroup;
  float lo[kMaxGroups], hi[kMaxGroups], zero[kMaxGroups], scale[kMaxGroups];
  int imin[kMaxGroups], imax[kMaxGroups];
  uint16_t s0[kMaxGroups], s1[kMaxGroups];
  auto count = [&](int j) { return int(std::min<int64_t>(G, cnt_u - int64_t(j) * G)); };
  for (int j = 0; j < ng; ++j) bitsplit_group_range(tile + j * G, count(j), c.f, lo[j], hi[j], imin[j], imax[j]);
  if (!c.f.log_scales) {
    const float Lf = float(c.f.levels());
    for (int j = 0; j < ng; ++j) {
      bitsplit_scales_bf16(lo[j], hi[j], Lf, s0[j], s1[j]);
      scale[j] = bf16_to_f32(s0[j]);
      zero[j] = bf16_to_f32(s1[j]);
    }
  } else {
    for (int j = 0; j < ng; ++j) {
      BitsplitGroup g;
      bitsplit_choose_scales(c.f, lo[j], hi[j], g);
      s0[j] = g.s0;
      s1[j] = g.s1;
      scale[j] = g.scale;
      zero[j] = g.zero;
    }
  }
  // The unit's uniforms in one call: long enough for the Philox loop to vectorise.
  if (rng.stochastic) bitsplit_uniforms(rng.key, uint32_t(rng.rank), eu, ng * G, u);
  for (int j = 0; j < ng; ++j) {
    BitsplitGroup g;
    g.zero = zero[j];
    g.scale = scale[j];
    g.s0 = s0[j];
    g.s1 = s1[j];
    g.imin = imin[j];
    g.imax = imax[j];
    if (c.f.spikes) {
      g.vmin = bitsplit_round_to_dtype(tile[j * G + imin[j]], c.f.dtype);
      g.vmax = bitsplit_round_to_dtype(tile[j * G + imax[j]], c.f.dtype);
    }
    bitsplit_quantize_group(tile + j * G, count(j), g, c.f, rng.stochastic, u + j * G, codes + j * G);
    bitsplit_store_meta(out, c.lay, c.f, gi0 + j, g);
  }
  for (int p = 0; p < c.planes; ++p)
    bitsplit_pack_plane(codes, ng * G, c.width[p], c.shift[p],
                        out + c.lay.plane[p] + gi0 * G * c.width[p] / 8);
}

// Groups of unit w in the block message -> tile[0, U) (zero past the data).
void decode_unit(const BlockCtx& c, const uint8_t* in, int64_t w, float* tile, uint8_t* codes) {
  const int G = c.f.group;
  const int64_t eu = w * c.U;
  const int64_t cnt_u = unit_count(c, w);
  const int64_t ng = ceil_div<int64_t>(cnt_u, G);
  const int64_t gi0 = (eu - c.e0) / G;
  std::memset(codes, 0, size_t(ng * G));
  for (int p = 0; p < c.planes; ++p)
    bitsplit_unpack_plane(in + c.lay.plane[p] + gi0 * G * c.width[p] / 8, int(ng * G), c.width[p],
                          c.shift[p], codes);
  for (int64_t j = 0; j < ng; ++j) {
    const int cnt = int(std::min<int64_t>(G, cnt_u - j * G));
    BitsplitGroup g;
    if (!bitsplit_load_meta(in, c.lay, c.f, gi0 + j, cnt, g))
      throw MalformedMessage("bitsplit: spike index outside its group (group " +
                             std::to_string(gi0 + j) + " of the block)");
    bitsplit_dequantize_group(codes + j * G, cnt, g, c.f, tile + j * G);
  }
  for (int64_t i = ng * G; i < c.U; ++i) tile[i] = 0.0f;
}

// body(scratch, w) for every wire position w of the block, over the codec
// threads (parallel_units), each thread with its own scratch.
template <class F>
void for_each_unit(const BlockCtx& c, const Block& b, F&& body) {
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Scratch s(c.U);
    for (int64_t u0, u1; runs.next(u0, u1);)
      for (int64_t w = u0; w < u1; ++w) body(s, w);
  });
}

}  // namespace

BitsplitParams resolve_bitsplit_params(double bits, int group_size, int spike_reserve,
                                       bool log_scales) {
  if (!(bits >= 2.0 && bits <= 8.0) || bits != std::floor(bits))
    throw Error("bitsplit: bits=" + std::to_string(bits) +
                " is not supported; use an integer width 2..8");
  BitsplitParams p;
  p.bits = int(bits);
  if (group_size == 0) {
    p.group = p.bits >= 5 ? 128 : 32;
  } else if (group_size < kBitsplitMinGroup || group_size > kBitsplitMaxGroup ||
             group_size % 32 != 0) {
    throw Error("bitsplit: group_size=" + std::to_string(group_size) +
                " is not supported; use 0 (default: 128 for 5-8 bits, 32 for 2-4 bits) or a "
                "multiple of 32 in [32, 256]");
  } else {
    p.group = group_size;
  }
  if (spike_reserve == -1) {
    p.spikes = p.bits <= 3;
  } else if (spike_reserve == 0 || spike_reserve == 1) {
    p.spikes = spike_reserve == 1;
  } else {
    throw Error("bitsplit: spike_reserve=" + std::to_string(spike_reserve) +
                " is not supported; use -1 (auto: on for 2 and 3 bits), 0 (off) or 1 (on)");
  }
  p.log_scales = log_scales;
  return p;
}

BitsplitCodec::BitsplitCodec(const BitsplitParams& p) : p_(p) {
  resolve_bitsplit_params(p.bits, p.group, p.spikes ? 1 : 0, p.log_scales);  // validates
  unit_ = p.group * std::max(1, kTargetUnit / p.group);
}

BitsplitFormat BitsplitCodec::format(DType dtype) const {
  BitsplitFormat f;
  f.bits = p_.bits;
  f.group = p_.group;
  f.spikes = p_.spikes;
  f.log_scales = p_.log_scales;
  f.dtype = dtype;
  return f;
}

Plan BitsplitCodec::make_plan(DType dtype, int64_t numel, int num_chunks) const {
  DQ_CHECK(num_chunks >= 1, "bitsplit plan: num_chunks must be >= 1");
  DQ_CHECK(numel >= 0, "bitsplit plan: negative numel");
  Plan p;
  p.dtype = dtype;
  p.numel = numel;
  p.unit = unit_;
  p.num_units = ceil_div<int64_t>(numel, unit_);
  const int64_t gb = group_bytes(dtype);
  p.wire_offset.resize(size_t(p.num_units) + 1);
  for (int64_t w = 0; w <= p.num_units; ++w) {
    const int64_t e = std::min(w * unit_, numel);
    p.wire_offset[size_t(w)] = ceil_div<int64_t>(e, p_.group) * gb;
  }
  p.chunk_begin.resize(size_t(num_chunks) + 1);
  for (int c = 0; c <= num_chunks; ++c) p.chunk_begin[size_t(c)] = p.num_units * c / num_chunks;
  return p;
}

int64_t BitsplitCodec::block_groups(const Plan& plan, const Block& b) const {
  return make_ctx(format(plan.dtype), plan, b).lay.ng;
}

size_t BitsplitCodec::static_bytes(const Plan& plan, const Block& b) const {
  return size_t(make_ctx(format(plan.dtype), plan, b).lay.total);
}

size_t BitsplitCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                               uint8_t* out) const {
  const BlockCtx c = make_ctx(format(plan.dtype), plan, b);
  for_each_unit(c, b, [&](Scratch& s, int64_t w) {
    if (unit_count(c, w) == 0) return;
    load_unit(x, plan, w, s.a.data());
    encode_unit(c, s.a.data(), w, rng, out, s.codes.data(), s.u.data());
  });
  return size_t(c.lay.total);
}

void BitsplitCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                               const Output& y) const {
  const BlockCtx c = make_ctx(format(plan.dtype), plan, b);
  check_message_size(in_bytes, size_t(c.lay.total), "bitsplit");
  for_each_unit(c, b, [&](Scratch& s, int64_t w) {
    if (unit_count(c, w) == 0) return;
    decode_unit(c, in, w, s.a.data(), s.codes.data());
    store_unit(y, plan, w, s.a.data());
  });
}

void BitsplitCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, float* acc) const {
  const BlockCtx c = make_ctx(format(plan.dtype), plan, b);
  check_message_size(in_bytes, size_t(c.lay.total), "bitsplit");
  for_each_unit(c, b, [&](Scratch& s, int64_t w) {
    float* dst = acc + (w - b.w0) * c.U;
    if (unit_count(c, w) == 0) {
      std::memset(dst, 0, size_t(c.U) * sizeof(float));
      return;
    }
    load_unit(x, plan, w, s.a.data());  // before writing: x may alias acc (same unit only)
    decode_unit(c, in, w, s.b.data(), s.codes.data());
    const float* xa = s.a.data();
    const float* xb = s.b.data();
    for (int32_t i = 0; i < c.U; ++i) dst[i] = xa[i] + xb[i];
  });
}

void BitsplitCodec::decompress_accumulate_output(const uint8_t* in, size_t in_bytes, const Local& x,
                                                 const Plan& plan, const Block& b, const Output& y) const {
  const BlockCtx c = make_ctx(format(plan.dtype), plan, b);
  check_message_size(in_bytes, size_t(c.lay.total), "bitsplit");
  for_each_unit(c, b, [&](Scratch& s, int64_t w) {
    if (unit_count(c, w) == 0) return;
    load_unit(x, plan, w, s.a.data());
    decode_unit(c, in, w, s.b.data(), s.codes.data());
    float* xa = s.a.data();
    const float* xb = s.b.data();
    for (int32_t i = 0; i < c.U; ++i) xa[i] = xa[i] + xb[i];
    store_unit(y, plan, w, xa);
  });
}

size_t BitsplitCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes,
                                                       const Local& x, const Plan& plan,
                                                       const Block& b, const RngCtx& rng,
                                                       uint8_t* out) const {
  const BlockCtx c = make_ctx(format(plan.dtype), plan, b);
  check_message_size(in_bytes, size_t(c.lay.total), "bitsplit");
  for_each_unit(c, b, [&](Scratch& s, int64_t w) {
    if (unit_count(c, w) == 0) return;
    load_unit(x, plan, w, s.a.data());
    decode_unit(c, in, w, s.b.data(), s.codes.data());
    float* xa = s.a.data();
    const float* xb = s.b.data();
    for (int32_t i = 0; i < c.U; ++i) xa[i] += xb[i];
    encode_unit(c, xa, w, rng, out, s.codes.data(), s.u.data());
  });
  return size_t(c.lay.total);
}

}  // namespace dynamiq
