// The DynamiQ CPU codec: one super-group (SG) encoded or decoded stage by stage
// (group maxima, scales, random words, strata, values), each stage's kernel
// chosen by the build's ISA (AVX2 or portable, at compile time) and the shape
// among the scalar and AVX2 files (dynamiq_cpu.h), and the Codec calls that
// run it over a block's SGs on the CPU threads. No run-time ISA choice: on an
// AVX-512 CPU the AVX2 kernels run (the AVX-512 ones were withdrawn until an
// AVX-512 machine runs them; CHANGELOG). Tables: dynamiq_tables.cc; plan
// helpers: dynamiq_plan.cc.
#include "kernels/dynamiq/dynamiq_codec.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/base/parallel.h"
#include "kernels/base/unit_io.h"
#include "kernels/dynamiq/dynamiq_cpu.h"
#include "kernels/dynamiq/dynamiq_cpu_avx2.h"

namespace dynamiq {
namespace dq_cpu {
namespace {

// Per-call scratch: one super-group's worth of everything (stays in L1/L2).
struct Work {
  std::vector<float> tile, gmax, scale_e, inv_e, pi, ginv, grun;
  std::vector<uint32_t> gr;
  std::vector<uint32_t> words, swords;
  std::vector<uint16_t> h16;
  std::vector<uint32_t> codes32;
  std::vector<float> a, p;
  std::vector<int32_t> j;
  const uint8_t* col8 = nullptr;  // byte column of the permutation table (3 <= n <= 8)
  explicit Work(int S, int G)
      : tile(size_t(S)), gmax(size_t(G)), scale_e(size_t(S)), inv_e(size_t(S)), pi(size_t(S)),
        ginv(size_t(G)), grun(size_t(S / 8 + 1)), gr(size_t(G)), words(size_t(S)),
        swords(size_t(S)), h16(size_t(S)), codes32(size_t(S)), a(size_t(S)), p(size_t(S)),
        j(size_t(S)) {}
};

// What every SG of a call shares.
struct Ctx {
  const DynamiqFormat& f;
  const DqTables& tb;
  bool stochastic_scales;
  const DynamiqTables& tables;
};

// ---- dispatch: each stage's kernel, by shape ---------------------------------------
// The AVX2 kernels where the build has them (compile time: the x86-64-v3
// baseline) and the shapes fit them, the portable kernel otherwise.

// words[4k + j] = word j of Philox call base + k, k < S/4.
void fill_words(const RngKey& key, uint64_t base, uint32_t purpose, uint32_t who, int S,
                uint32_t* __restrict words) {
  const int q = S / 4;
  const bool no_wrap = uint64_t(uint32_t(base)) + uint64_t(q) <= (uint64_t(1) << 32);
  if (no_wrap && q % 32 == 0) {
#if defined(__AVX2__)
    return avx2::fill_words(key, base, purpose, who, S, words);
#endif
  }
  scalar::fill_words(key, base, purpose, who, S, words);
}

inline void expand_u16_words(int S, uint32_t* __restrict w) {
#if defined(__AVX2__)
  avx2::expand_u16_words(S, w);
#else
  scalar::expand_u16_words(S, w);
#endif
}

inline void broadcast_groups(const float* __restrict v, int G, int s, float* __restrict out) {
#if defined(__AVX2__)
  if (s % 8 == 0) return avx2::broadcast_groups(v, G, s, out);
#endif
  scalar::broadcast_groups(v, G, s, out);
}

// One value per 16-element run from per-group values (s a multiple of 16):
// the group values themselves when s = 16 (no copy: a copy loop with one
// iteration per group cost more than the division it replaces), else each
// repeated s/16 times in buf (S/16 entries).
inline const float* per_run16(const float* v, int G, int s, float* buf) {
  if (s == 16) return v;
  broadcast_groups(v, G, s / 16, buf);
  return buf;
}

// One value per run of 2^rs elements (s a multiple of 8): runs of 16 when s is
// a multiple of 16 (per_run16), else of 8 (v itself when s = 8, else each
// value repeated s/8 times in buf, S/8 entries). Run r covers elements
// [r << rs, (r + 1) << rs).
inline const float* per_run(const float* v, int G, int s, float* buf, int& rs) {
  if (s % 16 == 0) {
    rs = 4;
    return per_run16(v, G, s, buf);
  }
  rs = 3;
  if (s == 8) return v;
  broadcast_groups(v, G, s / 8, buf);
  return buf;
}

// Strata of this rank for the S elements of SG src (0 when not correlated).
void fill_strata(const DqRounding& rd, const uint8_t* col8, int64_t src, int S,
                 uint32_t* __restrict sw, float* __restrict pi) {
  if (!rd.correlated) {
    for (int i = 0; i < S; ++i) pi[i] = 0.0f;
    return;
  }
  fill_words(rd.key, uint64_t(src) * uint64_t(S / 4), kPurposePermutation, 0, S, sw);
#if defined(__AVX2__)
  if (S % 8 == 0) return avx2::fill_strata(rd.perm, col8, S, sw, pi);
#endif
  scalar::fill_strata(rd.perm, S, sw, pi);
}

// Group maxima of |t| on the bit patterns (same order as the floats for
// non-nan values; any nan or inf makes the max >= 0x7f800000); returns the
// overall max.
uint32_t group_max(const float* __restrict t, int G, int s, float* __restrict gmax) {
#if defined(__AVX2__)
  if (s % 8 == 0) return avx2::group_max(t, G, s, gmax);
#endif
  return scalar::group_max(t, G, s, gmax);
}

// dq_group_scale_up for the G groups: codes into rk, 1/normaliser into ik.
void group_scales_up(const Ctx& cx, const float* __restrict gmax, float Msg, int G,
                     uint32_t* __restrict rk, float* __restrict ik) {
  int k0 = 0;
#if defined(__AVX2__)
  k0 = G - G % 8;
  avx2::group_scales_up(gmax, Msg, cx.tables.r255_rec(), k0, rk, ik);
#endif
  scalar::group_scales_up(gmax, Msg, cx.tb.r255, k0, G, rk, ik);
}

// ---- one SG ----------------------------------------------------------------------

// The scales of an SG with group maxima ws.gmax and overall max mbits (bits)
// to out (hierarchical: the bf16 SG scale and G uint8 group scales; flat: G
// bf16 scales), each group's 1/normaliser into ws.ginv. Returns where the
// codes go.
inline uint8_t* encode_scales(const Ctx& cx, const DqRounding& rd, int64_t src, uint32_t mbits,
                              Work& ws, uint8_t* out) {
  const int G = cx.f.S / cx.f.s;
  const bool bad = mbits >= 0x7f800000u;  // inf or nan: sent as nan
  const float* __restrict gmax = ws.gmax.data();
  float* __restrict ginv = ws.ginv.data();
  if (!cx.f.hierarchical) {
    scalar::flat_scales(gmax, G, bad, out, ginv);
    return out + 2 * G;
  }
  const uint16_t hb = bad ? uint16_t(0x7fc0u) : dq_sg_scale_bits(bits_f32(mbits));
  const float Msg = bf16_to_f32(hb);
  put_bf16(out, hb);
  if (bad) {
    for (int k = 0; k < G; ++k) {
      out[2 + k] = 0;
      ginv[k] = 0.0f;
    }
  } else if (cx.stochastic_scales) {
    scalar::group_scales_stochastic(gmax, Msg, cx.tb.r255, rd, src, G, out + 2, ginv);
  } else {
    // one vectorisable loop over the groups (scale codes into a uint32 array
    // first: byte stores would alias the inputs)
    uint32_t* __restrict rk = ws.gr.data();
    group_scales_up(cx, gmax, Msg, G, rk, ginv);
    for (int k = 0; k < G; ++k) out[2 + k] = uint8_t(rk[k]);
  }
  return out + 2 + G;
}

// The codes of an SG of width B in {1, 2, 4, 8} from ws.tile to out, its
// scales done (ws.ginv).
template <int B>
void encode_codes(const Ctx& cx, const DqRounding& rd, int64_t src, Work& ws, uint8_t* out) {
  const int S = cx.f.S, s = cx.f.s, G = S / s;
  const float* __restrict t = ws.tile.data();
  const DqLevels& lv = cx.tb.lv[dynamiq_width_index(B)];
  uint32_t* __restrict w = ws.words.data();
  float* __restrict pi = ws.pi.data();
  // S/8 Philox calls give S/2 words; call c rounds the 8 elements of octet c
  // (dq_octet_word)
  const uint64_t value_call = uint64_t(src) * uint64_t(S / 8);
#if defined(__AVX2__)
  if constexpr (B >= 2) {
    // The fused AVX2 value loop: reads w only when stochastic (the 16-bit
    // words unexpanded), pi only when correlated, and one 1/normaliser per
    // 8- or 16-element run.
    if ((S * B / 8) % 32 == 0 && s % 8 == 0) {
      if (rd.stochastic) fill_words(rd.key, value_call, kPurposeValue, rd.rank, S / 2, w);
      if (rd.correlated) fill_strata(rd, ws.col8, src, S, ws.swords.data(), pi);
      const float* pic = rd.correlated ? pi : nullptr;
      const uint32_t* rec = cx.tables.cell_rec(dynamiq_width_index(B));
      int rs = 0;
      const float* gv = per_run(ws.ginv.data(), G, s, ws.grun.data(), rs);
      return avx2::encode_values<B>(lv, rec, rd, S, t, gv, rs, pic, w, out);
    }
  }
#endif
  // the portable passes: 1/normaliser per element, words expanded (0 when
  // not stochastic), strata (0 when not correlated)
  float* __restrict inv_e = ws.inv_e.data();
  broadcast_groups(ws.ginv.data(), G, s, inv_e);
  if (rd.stochastic) {
    fill_words(rd.key, value_call, kPurposeValue, rd.rank, S / 2, w);
    expand_u16_words(S, w);
  } else {
    for (int i = 0; i < S; ++i) w[i] = 0;
  }
  fill_strata(rd, ws.col8, src, S, ws.swords.data(), pi);
  const scalar::Passes ps{ws.a.data(), ws.p.data(), ws.j.data(), ws.codes32.data()};
  scalar::encode_values<B>(lv, rd, S, t, inv_e, pi, w, ps, out);
}

// Encodes one SG of width B from ws.tile into out.
template <int B>
void encode_sg(const Ctx& cx, const DqRounding& rd, int64_t src, Work& ws, uint8_t* out) {
  const int S = cx.f.S, s = cx.f.s, G = S / s;
  if constexpr (B == 16) {
    scalar::encode_bf16(ws.tile.data(), S, ws.h16.data(), out);
  } else {
    const uint32_t mbits = group_max(ws.tile.data(), G, s, ws.gmax.data());
    uint8_t* codes = encode_scales(cx, rd, src, mbits, ws, out);
    encode_codes<B>(cx, rd, src, ws, codes);
  }
}

// The decoded group scales of an SG (G of them, into gsc); returns where its
// codes start.
inline const uint8_t* decode_scales(const Ctx& cx, const uint8_t* in, float* __restrict gsc) {
  const int G = cx.f.S / cx.f.s;
  if (cx.f.hierarchical) {
    const float Msg = bf16_to_f32(get_bf16(in));
    for (int k = 0; k < G; ++k) gsc[k] = cx.tb.r255[in[2 + k]] * Msg;
    return in + 2 + G;
  }
  for (int k = 0; k < G; ++k) gsc[k] = bf16_to_f32(get_bf16(in + 2 * k));
  return in + 2 * G;
}

// Decodes one SG of width B into tile (tile = base + value when base).
template <int B>
void decode_sg(const Ctx& cx, const uint8_t* in, const float* __restrict base, Work& ws,
               float* __restrict tile) {
  const int S = cx.f.S, s = cx.f.s, G = S / s;
  if constexpr (B == 16) {
    scalar::decode_bf16(in, S, base, tile);
  } else {
    float* __restrict gsc = ws.gmax.data();  // G decoded group scales
    const uint8_t* codes = decode_scales(cx, in, gsc);
    const float* __restrict dec = cx.tb.lv[dynamiq_width_index(B)].decode;
#if defined(__AVX2__)
    if constexpr (B >= 2) {
      const int nb = S / (8 / B);
      if (nb % 8 == 0 && s % 8 == 0) {
        int rs = 0;
        const float* gv = per_run(gsc, G, s, ws.grun.data(), rs);
        return avx2::decode_values<B>(dec, codes, S, gv, rs, base, tile);
      }
    }
#endif
    float* __restrict sc = ws.scale_e.data();
    broadcast_groups(gsc, G, s, sc);
    scalar::decode_values<B>(dec, codes, S, sc, base, tile);
  }
}

// Runtime width -> compile-time B.
template <typename F>
inline void dispatch_width(int b, F&& f) {
  switch (b) {
    case 1: f(std::integral_constant<int, 1>()); return;
    case 2: f(std::integral_constant<int, 2>()); return;
    case 4: f(std::integral_constant<int, 4>()); return;
    case 8: f(std::integral_constant<int, 8>()); return;
    case 16: f(std::integral_constant<int, 16>()); return;
  }
  throw Error("dynamiq: width " + std::to_string(b) + " is not one of 1, 2, 4, 8, 16");
}

inline void zero_padding(const Plan& plan, int64_t src, float* tile) {
  const int64_t cnt = plan.unit_elem_count(src);
  for (int64_t i = cnt; i < plan.unit; ++i) tile[i] = 0.0f;
}

// Work for one part of a call (parallel_units): scratch, and the column of
// the permutation table when correlated rounding uses one.
Work make_work(const DynamiqFormat& f, const DqRounding& rd) {
  Work ws(f.S, f.S / f.s);
  if (rd.correlated && rd.perm.n >= 3 && rd.perm.n <= uint32_t(kPermTableMaxN))
    ws.col8 = perm_table_column8(int(rd.perm.n), int(rd.perm.rank));
  return ws;
}

Ctx make_ctx(const DynamiqParams& p, const DynamiqTables& tables) {
  return Ctx{p.fmt, tables.view(), p.stochastic_group_scales, tables};
}

}  // namespace
}  // namespace dq_cpu

// ---- the codec ------------------------------------------------------------------

using dq_cpu::Ctx;
using dq_cpu::decode_sg;
using dq_cpu::dispatch_width;
using dq_cpu::encode_sg;
using dq_cpu::make_ctx;
using dq_cpu::make_work;
using dq_cpu::Work;
using dq_cpu::zero_padding;

namespace {

// Super-groups per thread below which a call does not split (256 x 256
// elements: ~0.3 ms of fused work, against ~10-50 us to wake a helper), and
// the longest run of super-groups a thread claims at a time (~60 us of fused
// work; the prefetch stops at a run's end: 64-unit runs made the 2-thread
// fused kernel 4-5 % slower on single-width plans).
constexpr int64_t kMinUnitsPerThread = 256;
constexpr int64_t kUnitsPerRun = 256;

// Units to prefetch ahead of the one being loaded: about 8 KiB of local data
// (fp32 1 KiB units: 8 ahead; bf16: 16). Measured on the fused fp32 mix5 kernel
// at 64 MiB with the hook's kind of plan (super-groups read at scattered
// places in width order, means subtracted), ns/element: 1, 2, 4, 8, 16, 32 KiB
// ahead gave 1.38-1.49, 1.23-1.32, 1.28-1.36, 1.12-1.19, 1.20-1.22, 1.14-1.19
// (the previous revision, no prefetch: 1.65-1.80; the hardware prefetchers
// cannot follow the jumps).
// With super-groups read in order, 4 KiB was best (1.06-1.11 against 1.15-1.17).
inline int64_t prefetch_ahead(const Plan& plan) {
  const int64_t unit_bytes = int64_t(plan.unit) * dtype_size(plan.dtype);
  return std::max<int64_t>(1, 8192 / std::max<int64_t>(1, unit_bytes));
}

// Wire bytes of positions [b.w0, w): where the part starting at w reads or writes.
inline int64_t wire_from(const Plan& plan, const Block& b, int64_t w) {
  return plan.wire_offset[size_t(w)] - plan.wire_offset[size_t(b.w0)];
}

}  // namespace

DynamiqCodec::DynamiqCodec(const DynamiqParams& p) : p_(p), tables_(p) {}

void DynamiqCodec::check_plan(const Plan& plan) const {
  const PlanKey key = plan_key(plan);
  if (checked_.contains(key)) return;
  const DynamiqFormat& f = p_.fmt;
  DQ_CHECK(plan.unit == f.S, "dynamiq codec: plan.unit (" + std::to_string(plan.unit) +
                                 ") differs from the super-group size S (" + std::to_string(f.S) +
                                 ")");
  DQ_CHECK(plan.num_units == ceil_div<int64_t>(plan.numel, plan.unit),
           "dynamiq codec: plan.num_units inconsistent with numel");
  DQ_CHECK(plan.bits.size() == size_t(plan.num_units), "dynamiq codec: plan.bits has the wrong size");
  DQ_CHECK(plan.order.empty() || plan.order.size() == size_t(plan.num_units),
           "dynamiq codec: plan.order has the wrong size");
  DQ_CHECK(plan.wire_offset.size() == size_t(plan.num_units) + 1,
           "dynamiq codec: plan.wire_offset has the wrong size");
  DQ_CHECK(plan.bias.empty() || plan.bias.size() == size_t(plan.num_units),
           "dynamiq codec: plan.bias has the wrong size");
  int64_t sg_bytes[256];  // by width; -1: not a width
  for (int bits = 0; bits < 256; ++bits) sg_bytes[bits] = dynamiq_width_index(bits) >= 0 ? dynamiq_sg_bytes(bits, f) : -1;
  const int64_t* off = plan.wire_offset.data();
  for (int64_t w = 0; w < plan.num_units; ++w) {
    const int64_t src = plan.src_unit(w);
    DQ_CHECK(src >= 0 && src < plan.num_units, "dynamiq codec: plan.order entry out of range");
    const int bits = plan.bits[size_t(src)];
    DQ_CHECK(sg_bytes[bits] >= 0, "dynamiq codec: width " + std::to_string(bits) + " is not one of 1, 2, 4, 8, 16");
    DQ_CHECK(off[w + 1] - off[w] == sg_bytes[bits],
             "dynamiq codec: plan.wire_offset disagrees with plan.bits at wire position " + std::to_string(w) +
                 " (fill it with dynamiq_fill_wire_offsets)");
  }
  checked_.insert(key);
}

size_t DynamiqCodec::check_block(const Plan& plan, const Block& b) const {
  check_plan(plan);
  DQ_CHECK(b.w0 >= 0 && b.w0 <= b.w1 && b.w1 <= plan.num_units, "dynamiq codec: block out of range");
  return size_t(plan.wire_offset[size_t(b.w1)] - plan.wire_offset[size_t(b.w0)]);
}

size_t DynamiqCodec::static_bytes(const Plan& plan, const Block& b) const {
  return check_block(plan, b);
}

size_t DynamiqCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                              uint8_t* out) const {
  const size_t bytes = check_block(plan, b);
  const DqRounding rd = make_dynamiq_rounding(rng);
  const Ctx cx = make_ctx(p_, tables_);
  const int64_t ahead = prefetch_ahead(plan);
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws = make_work(p_.fmt, rd);
    for (int64_t u0, u1; runs.next(u0, u1);) {
      uint8_t* o = out + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int64_t src = plan.src_unit(w);
        if (w + ahead < u1) prefetch_unit(x, plan, w + ahead);
        load_unit(x, plan, w, ws.tile.data());
        const int bits = plan.bits[size_t(src)];
        dispatch_width(bits, [&](auto B) { encode_sg<decltype(B)::value>(cx, rd, src, ws, o); });
        o += dynamiq_sg_bytes(bits, p_.fmt);
      }
    }
  });
  return bytes;
}

void DynamiqCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan,
                              const Block& b, const Output& y) const {
  check_message_size(in_bytes, check_block(plan, b), "dynamiq");
  const Ctx cx = make_ctx(p_, tables_);
  const int64_t ahead = prefetch_ahead(plan);
  Local yl;  // the output bucket, for prefetching the units about to be written
  yl.bucket = y.bucket;
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws(p_.fmt.S, p_.fmt.S / p_.fmt.s);
    for (int64_t u0, u1; runs.next(u0, u1);) {
      const uint8_t* p = in + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int bits = plan.bits[size_t(plan.src_unit(w))];
        if (w + ahead < u1) prefetch_unit(yl, plan, w + ahead);
        dispatch_width(
            bits, [&](auto B) { decode_sg<decltype(B)::value>(cx, p, nullptr, ws, ws.tile.data()); });
        store_unit(y, plan, w, ws.tile.data());
        p += dynamiq_sg_bytes(bits, p_.fmt);
      }
    }
  });
}

void DynamiqCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                         const Plan& plan, const Block& b, float* acc) const {
  check_message_size(in_bytes, check_block(plan, b), "dynamiq");
  const Ctx cx = make_ctx(p_, tables_);
  const int64_t ahead = prefetch_ahead(plan);
  const int64_t U = plan.unit;
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws(p_.fmt.S, p_.fmt.S / p_.fmt.s);
    for (int64_t u0, u1; runs.next(u0, u1);) {
      const uint8_t* p = in + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int64_t src = plan.src_unit(w);
        const int bits = plan.bits[size_t(src)];
        if (w + ahead < u1) prefetch_unit(x, plan, w + ahead);
        load_unit(x, plan, w, ws.tile.data());  // before writing: x may alias acc
        float* dst = acc + (w - b.w0) * U;
        dispatch_width(
            bits, [&](auto B) { decode_sg<decltype(B)::value>(cx, p, ws.tile.data(), ws, dst); });
        zero_padding(plan, src, dst);
        p += dynamiq_sg_bytes(bits, p_.fmt);
      }
    }
  });
}

void DynamiqCodec::decompress_accumulate_output(const uint8_t* in, size_t in_bytes, const Local& x,
                                                const Plan& plan, const Block& b, const Output& y) const {
  check_message_size(in_bytes, check_block(plan, b), "dynamiq");
  const Ctx cx = make_ctx(p_, tables_);
  const int64_t ahead = prefetch_ahead(plan);
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws(p_.fmt.S, p_.fmt.S / p_.fmt.s);
    std::vector<float> local(size_t(p_.fmt.S));
    for (int64_t u0, u1; runs.next(u0, u1);) {
      const uint8_t* p = in + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int bits = plan.bits[size_t(plan.src_unit(w))];
        if (w + ahead < u1) prefetch_unit(x, plan, w + ahead);
        load_unit(x, plan, w, local.data());
        dispatch_width(
            bits, [&](auto B) { decode_sg<decltype(B)::value>(cx, p, local.data(), ws, ws.tile.data()); });
        store_unit(y, plan, w, ws.tile.data());
        p += dynamiq_sg_bytes(bits, p_.fmt);
      }
    }
  });
}

size_t DynamiqCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes,
                                                      const Local& x, const Plan& plan,
                                                      const Block& b, const RngCtx& rng,
                                                      uint8_t* out) const {
  const size_t bytes = check_block(plan, b);
  check_message_size(in_bytes, bytes, "dynamiq");
  const DqRounding rd = make_dynamiq_rounding(rng);
  const Ctx cx = make_ctx(p_, tables_);
  const int64_t ahead = prefetch_ahead(plan);
  parallel_units(b.w0, b.w1, kMinUnitsPerThread, kUnitsPerRun, [&](UnitRuns& runs) {
    Work ws = make_work(p_.fmt, rd);
    std::vector<float> local(size_t(p_.fmt.S));
    for (int64_t u0, u1; runs.next(u0, u1);) {
      const uint8_t* p = in + wire_from(plan, b, u0);
      uint8_t* o = out + wire_from(plan, b, u0);
      for (int64_t w = u0; w < u1; ++w) {
        const int64_t src = plan.src_unit(w);
        const int bits = plan.bits[size_t(src)];
        const int64_t sg = dynamiq_sg_bytes(bits, p_.fmt);
        // the unit `ahead` positions on, in two halves: a burst of 16 line
        // prefetches into a 4 KiB page not in the TLB stalled the loads behind
        // it (perf; the stall went away on 2 MiB pages). 0.96-0.97 against
        // 0.99-1.02 ns/element, fp32 mix5 at 64 MiB.
        const bool pf = w + ahead < u1;
        if (pf) prefetch_unit(x, plan, w + ahead, 0, 2);
        load_unit(x, plan, w, local.data());
        dispatch_width(bits, [&](auto B) {
          constexpr int BB = decltype(B)::value;
          decode_sg<BB>(cx, p, local.data(), ws, ws.tile.data());
          zero_padding(plan, src, ws.tile.data());
          if (pf) prefetch_unit(x, plan, w + ahead, 1, 2);
          encode_sg<BB>(cx, rd, src, ws, o);
        });
        p += sg;
        o += sg;
      }
    }
  });
  return bytes;
}

void dynamiq_fill_words(const RngKey& key, uint64_t call0, uint32_t purpose, uint32_t who, int S,
                        uint32_t* words) {
  DQ_CHECK(S % 4 == 0, "dynamiq_fill_words: S must be a multiple of 4");
  dq_cpu::fill_words(key, call0, purpose, who, S, words);
}

}  // namespace dynamiq
