// DynamiQ per-element and per-group math (paper section 3.3), shared by the
// CPU loops (dynamiq_codec.cc) and the CUDA kernels (cuda/dynamiq_kernels.cu).
// This is the definition: the CPU kernels' explicit AVX2 paths re-express it
// and must agree with it bit for bit (tests/cpp/test_dynamiq_fastpath.cc
// compares every CPU kernel against a per-element loop over these functions).
// Everything here is __host__ __device__, uses only +, -, *, /, comparisons and
// integer operations (no libm transcendental), so the CPU and the GPU produce
// the same bits. The build disables floating-point contraction (CMakeLists:
// -ffp-contract=off, nvcc --fmad=false); the one multiply-add that matters,
// decompress-accumulate, is an explicit fmaf on both sides.
//
// Notation for one super-group (SG) of S values t[0..S) (mean already removed)
// cut into G = S/s groups of s values, coded with width b:
//   g_k   = max |t| over group k,  M = max_k g_k
//   Msg   = M rounded UP to bf16 (the SG scale on the wire; saturated at the
//           largest finite bf16 when M is finite but larger)
//   r_k   = uint8 group scale; decoded group scale sc_k = R255[r_k] * Msg with
//           R255[r] = float(r / 255) (so r = 255 gives Msg exactly)
//   value = decode_b[code] * sc_k, code = sign << (b-1) | idx (b >= 2),
//           decode_b[code] = +-L[idx]; b = 1: code 1 -> +sc_k, 0 -> -sc_k.
// Levels (b >= 2): L[r] = ((1+2 eps^2)^r - 1) / ((1+2 eps^2)^m - 1), r = 0..m,
// m = 2^(b-1) - 1 (uniform r/m when eps -> 0). Width 2 has L = {0, 1} for any eps.
//
// Rounding of the normalised magnitude a = |t_i| / norm_k in [0, 1]:
// bracket L[j] <= a < L[j+1], p = (a - L[j]) / (L[j+1] - L[j]), idx = j + up
// with P(up) = p, so E[L[idx]] = a (unbiased at both levels). up is decided
// by (pi + gamma) < p * n, i.e. u = (pi + gamma)/n < p, with gamma a private
// uniform and pi the shared stratum (permutation.h); independent rounding is
// the case n = 1, pi = 0. Negative values use 1 - u (see dq_round_up).
// gamma is a 16-bit uniform at the cell midpoints, (h + 1/2) / 2^16 with h
// uniform in [0, 2^16) (two per Philox word, eight per call: README.md,
// "Randomness"). Independent rounding: P(up) = round(p * 2^16) / 2^16, so
// the rounding is unbiased up to |P(up) - p| <= 2^-17 of a level gap; with n
// strata only the stratum floor(p n) is fractional and the bound is 2^-17 / n
// (n <= 128; up to n = 256 the midpoint bit does not fit: 2^-16 / n; beyond,
// gamma keeps 24 - ceil(log2 n) bits), plus the float rounding of p * n
// (2^(ceil(log2 n) - 25) / n, as before). Tested by enumeration
// (DynamiqRounding.SixteenBitUniformsAreUnbiasedTo2PowMinus17).
//
// Group scales, two unbiased variants (DynamiqParams::stochastic_group_scales):
//   stochastic (paper): r_k = floor(255 g_k/Msg) + Bernoulli(frac), norm_k = g_k,
//       E[sc_k] = g_k and independent of the value rounding, so
//       E[value] = E[decode] E[sc] = (t/g_k) g_k = t;
//   up:  r_k = the smallest r with R255[r]*Msg >= g_k, norm_k = sc_k (a <= 1),
//       deterministic, so E[value] = sc_k E[+-L[idx]] = t.
// Flat scales (ablation, hierarchical = false): sc_k = g_k rounded up to bf16.
#pragma once

#include <cmath>

#include "kernels/dynamiq/dynamiq_format.h"
#include "kernels/base/bytes.h"
#include "kernels/base/float_bits.h"
#include "kernels/dynamiq/permutation.h"
#include "kernels/base/philox.h"

namespace dynamiq {

// ---- tables ----------------------------------------------------------------------

// One width's levels, as pointers into host or device memory.
struct DqLevels {
  int32_t width = 0;              // 1, 2, 4 or 8
  int32_t m = 0;                  // top index 2^(b-1) - 1 (0 for width 1)
  const float* level = nullptr;   // m + 1 values, level[0] = 0, level[m] = 1
  const float* invgap = nullptr;  // m values, 1 / (level[j+1] - level[j])
  const float* decode = nullptr;  // 2^b values: code -> signed level
  // Bracket search for width 8: cell c covers the floats whose bit patterns lie
  // in [cell_base + c << cell_shift, cell_base + (c+1) << cell_shift);
  // cell[c] = the largest j <= m-1 with level[j] <= the cell's lowest value.
  // The builder makes cells fine enough to hold at most one level each, so one
  // step j += (a >= level[j+1]) reaches the bracket. int32 so that the CPU
  // loop can gather it.
  const int32_t* cell = nullptr;
  uint32_t cell_base = 0;
  int32_t cell_shift = 0;
  int32_t ncells = 0;
};

struct DqTables {
  DqLevels lv[4];               // widths 1, 2, 4, 8 (dynamiq_width_index)
  const float* r255 = nullptr;  // 256 values: float(r / 255)
};

// ---- rounding context -----------------------------------------------------------

// Everything one compression call needs to draw its rounding decisions.
struct DqRounding {
  RngKey key{0, 0};
  uint32_t rank = 0;       // private counter word
  bool stochastic = true;  // false: round to nearest level (biased; ablation)
  bool correlated = false; // n > 1 and correlated rounding requested
  PermParams perm;         // shared permutation (used when correlated)
  float nf = 1.0f;         // number of strata: n when correlated, else 1
  uint32_t gshift = 8;     // gamma = float(w >> gshift) * gscale in [0, 1)
  float gscale = 1.0f / 16777216.0f;
};

// gamma keeps at most 24 - ceil(log2 n) bits of the rounding word w so that
// pi + gamma is exact in float and < pi + 1. w = dq_u16_word(h) carries 17
// significant bits (h and the midpoint bit): all kept for n <= 128.
inline DqRounding make_rounding(const RngKey& key, int rank, int world, bool correlated,
                                bool stochastic, const PermParams& perm) {
  DqRounding r;
  r.key = key;
  r.rank = uint32_t(rank);
  r.stochastic = stochastic;
  r.correlated = stochastic && correlated && world > 1;
  if (r.correlated) {
    r.perm = perm;
    r.nf = float(world);
    int k = 0;
    while ((1 << k) < world) ++k;
    r.gshift = uint32_t(8 + k);
    r.gscale = 1.0f / float(1u << (24 - k));
  }
  return r;
}

// ---- random words -----------------------------------------------------------------
// The layout (which Philox call and which bits each element and group takes)
// is defined, with the reasons for it, in README.md ("Randomness"); these
// functions are its per-element reference. Counter = (call low 32 bits,
// purpose, rank or 0 for shared, call high 32 bits). In short: element i of
// source SG `src` (S values, S a multiple of 8) rounds with a 16-bit half of
// call src*(S/8) + i/8: word (i%8)%4, the low half for i%8 < 4 and the high
// half otherwise (dq_value_word); its shared permutation word is word i%4 of
// call src*(S/4) + i/4 (dq_word32); group k's scale word is word k%4 of call
// src*ceil(G/4) + k/4. A thread (or SIMD lane group) that handles the 8
// contiguous elements of an octet draws one value call and two permutation
// calls for them.

DQ_HD Philox4x32 dq_draw(const RngKey& key, uint64_t call, uint32_t purpose, uint32_t who) {
  return philox4x32_10(uint32_t(call), purpose, who, uint32_t(call >> 32), key.k0, key.k1);
}

// Word k (0..3, known only at run time) of a Philox result, by selects: an
// indexed read of r.v would put the result in local memory on a GPU.
DQ_HD uint32_t dq_word_of(const Philox4x32& r, int32_t k) {
  const uint32_t lo = (k & 1) ? r.v[1] : r.v[0];
  const uint32_t hi = (k & 1) ? r.v[3] : r.v[2];
  return (k & 2) ? hi : lo;
}

DQ_HD uint32_t dq_word32(const RngKey& key, uint32_t purpose, uint32_t who, int64_t src, int32_t S,
                         int32_t i) {
  const Philox4x32 r = dq_draw(key, uint64_t(src) * uint64_t(S / 4) + uint64_t(i / 4), purpose, who);
  return dq_word_of(r, i % 4);
}

// A 16-bit uniform h as the rounding word dq_round_up reads: (h << 16) | 0x8000
// (the set bit below h puts gamma at the midpoint of h's cell).
DQ_HD uint32_t dq_u16_word(uint32_t h16) { return (h16 << 16) | 0x8000u; }

// The rounding word of element e (0..7) of an octet from its value call r:
// the low half of word e for e < 4, the high half of word e - 4 otherwise.
// With e a compile-time constant (an unrolled loop) this is two instructions.
DQ_HD uint32_t dq_octet_word(const Philox4x32& r, int32_t e) {
  const uint32_t v = dq_word_of(r, e & 3);
  return dq_u16_word(e < 4 ? (v & 0xffffu) : (v >> 16));
}

// The rounding word of element i (S a multiple of 8).
DQ_HD uint32_t dq_value_word(const RngKey& key, uint32_t purpose, uint32_t who, int64_t src,
                             int32_t S, int32_t i) {
  const Philox4x32 r = dq_draw(key, uint64_t(src) * uint64_t(S / 8) + uint64_t(i / 8), purpose, who);
  return dq_octet_word(r, i % 8);
}

DQ_HD uint32_t dq_group_word(const RngKey& key, uint32_t who, int64_t src, int32_t G, int32_t k) {
  const int64_t calls = (G + 3) / 4;
  const Philox4x32 r = dq_draw(key, uint64_t(src) * uint64_t(calls) + uint64_t(k / 4),
                               kPurposeGroupScale, who);
  return dq_word_of(r, k % 4);
}

// The stratum of this rank for element i (0 when not correlated), as a float.
DQ_HD float dq_stratum(const DqRounding& rd, int64_t src, int32_t S, int32_t i) {
  if (!rd.correlated) return 0.0f;
  return float(perm_eval(rd.perm, dq_word32(rd.key, kPurposePermutation, 0, src, S, i)));
}

// Magnitude rounds up iff u < p, u = (pi + gamma)/n, evaluated as
// pi + gamma < p * n; for a negative value u is replaced by 1 - u (evaluated
// as n - (pi + gamma), exact on gamma's grid). So on every rank "u small"
// means "rounded toward +infinity": the ranks' signed errors are all
// decreasing in their u, and stratified u's make them negatively correlated
// whatever the signs (with magnitude-oriented u, values of opposite signs would
// get positively correlated errors and i.i.d. data would gain nothing).
DQ_HD uint32_t dq_round_up(float p, float pi, uint32_t w, uint32_t neg, const DqRounding& rd) {
  // Everything computed unconditionally and combined bitwise: gcc does not
  // speculate floating-point operations or comparisons under -ftrapping-math
  // and would leave a branch in the loop (no vectorisation).
  const float g1 = float(int32_t(w >> rd.gshift)) * rd.gscale;  // < 2^24: signed convert
  const float gam = rd.stochastic ? g1 : 0.5f;
  const float v = pi + gam;
  const float vn = rd.nf - v;
  const float pn = p * rd.nf;
  const uint32_t up_pos = v < pn ? 1u : 0u;
  const uint32_t up_neg = vn < pn ? 1u : 0u;
  return (up_neg & neg) | (up_pos & (neg ^ 1u));  // bitwise: no branch for gcc to keep
}

// ---- scales -----------------------------------------------------------------------

// A bf16 scale: M rounded up to bf16, saturated to the largest finite bf16 when
// M is finite (inf/nan pass through: such a tile is already non-finite), and
// raised to `min_bits` when 0 < M is below it. The floors keep every nonzero
// normaliser a normal float with a finite reciprocal (below 2^-128 the
// reciprocal overflows and the values would be coded as garbage):
//  - SG scale (hierarchical): 2^-118, so that r/255 of it (r >= 1) is >= 2^-126;
//  - flat group scale: 2^-126.
// An SG (group) whose values are all below the floor is coded on a coarser
// grid than its size would allow; still unbiased.
constexpr uint16_t kDqMinSgScaleBits = 0x0480u;    // bf16 2^-118
constexpr uint16_t kDqMinFlatScaleBits = 0x0080u;  // bf16 2^-126
DQ_HD uint16_t dq_scale_bits(float M, uint16_t min_bits) {
  uint16_t h = f32_to_bf16_ceil_pos(M);
  if (h == 0x7f80u && M <= 3.4028234663852886e38f) h = 0x7f7fu;
  if (h != 0 && h < min_bits) h = min_bits;
  return h;
}
DQ_HD uint16_t dq_sg_scale_bits(float M) { return dq_scale_bits(M, kDqMinSgScaleBits); }

// Group scale code and the magnitude the values are normalised by.
struct DqGroupScale {
  uint8_t r;
  float sc;    // decoded group scale
  float inv;   // 1 / normaliser (0 when the normaliser is 0)
};

DQ_HD DqGroupScale dq_group_scale_stochastic(float g, float Msg, const float* r255, uint32_t w) {
  DqGroupScale o{0, 0.0f, 0.0f};
  if (!(Msg > 0.0f)) return o;
  // A nonzero group max is raised to the smallest normal float (Msg >= 2^-118
  // exceeds it) so that 1/g is finite; it still bounds the group's values.
  g = g > 0.0f && g < 1.17549435e-38f ? 1.17549435e-38f : g;
  float t = (g / Msg) * 255.0f;
  t = t < 255.0f ? t : 255.0f;  // also maps nan to 255
  t = t > 0.0f ? t : 0.0f;
  const uint32_t lo = uint32_t(t);  // floor, t in [0, 255]
  const float frac = t - float(lo);
  uint32_t r = lo + (u01(w) < frac ? 1u : 0u);
  r = r < 255u ? r : 255u;
  o.r = uint8_t(r);
  o.sc = r255[r] * Msg;
  o.inv = g > 0.0f ? 1.0f / g : 0.0f;
  return o;
}

// The smallest r with R255[r] * Msg >= g. t = 255 g / Msg is within ~1e-4 of
// the exact ratio (three float roundings of a value <= 255), so ceil(t) is at
// most one step from the answer: one fix-up each way, branch-free (the CPU
// computes the 16 groups of an SG in one vectorised loop).
DQ_HD DqGroupScale dq_group_scale_up(float g, float Msg, const float* r255) {
  // g, Msg are finite and >= 0 here (an SG with inf/nan never gets this far),
  // so every comparison is made on bit patterns as integers: same results as
  // the float comparisons, and no FP compare for gcc to keep as a branch.
  const int32_t gb = int32_t(f32_bits(g)), mb = int32_t(f32_bits(Msg));
  const bool live = (gb > 0) & (mb > 0);
  // selects on bit patterns before a division: gcc would otherwise turn a
  // float select feeding a division into a branch (division may trap)
  const float Mq = bits_f32(mb > 0 ? uint32_t(mb) : 0x3f800000u);
  const float t0 = (g / Mq) * 255.0f;
  const uint32_t tb = f32_bits(t0);
  const float t = bits_f32(tb < 0x437f0000u ? tb : 0x437f0000u);  // min(t0, 255) on the bits
  int32_t r = int32_t(t);                                                     // floor (t >= 0)
  r += int32_t(f32_bits(float(r))) < int32_t(f32_bits(t)) ? 1 : 0;           // ceil
  r = r < 255 ? r : 255;
  r += ((r < 255) & (int32_t(f32_bits(r255[r] * Mq)) < gb)) ? 1 : 0;
  const int32_t rm = r > 0 ? r - 1 : 0;
  r -= ((r > 0) & (int32_t(f32_bits(r255[rm] * Mq)) >= gb)) ? 1 : 0;
  r = live ? r : 0;
  const float sc = r255[r] * Mq;
  const bool pos = live & (int32_t(f32_bits(sc)) > 0);
  const float inv = 1.0f / bits_f32(pos ? f32_bits(sc) : 0x3f800000u);
  DqGroupScale o;
  o.r = uint8_t(r);
  o.sc = live ? sc : 0.0f;
  o.inv = pos ? inv : 0.0f;
  return o;
}

// Flat (ablation): the group's own bf16 scale, rounded up.
DQ_HD DqGroupScale dq_group_scale_flat(float g, uint16_t& bits) {
  bits = dq_scale_bits(g, kDqMinFlatScaleBits);
  DqGroupScale o{0, bf16_to_f32(bits), 0.0f};
  o.inv = o.sc > 0.0f ? 1.0f / o.sc : 0.0f;
  return o;
}

// ---- values -----------------------------------------------------------------------

// j with level[j] <= a < level[j+1] (j = m-1 for a >= level[m-1]... up to 1).
template <int B>
DQ_HD int32_t dq_bracket(const DqLevels& t, float a) {
  if constexpr (B == 2) {
    return 0;
  } else if constexpr (B == 4) {
    // a, levels >= 0: compare bit patterns as integers (no FP compare for gcc
    // to keep as a branch under -ftrapping-math). ab >= L <=> L - 1 - ab < 0
    // (both in [0, 2^30]: no overflow), so each step adds that sign bit: two
    // integer instructions on a GPU (a compare and a select were three)
    const int32_t ab = int32_t(f32_bits(a));
    int32_t j = 0;
    for (int k = 1; k < 7; ++k) j += int32_t(uint32_t(int32_t(f32_bits(t.level[k])) - 1 - ab) >> 31);
    return j;
  } else {
    // a in [0, 1]: its bits fit int32. Cells below cell_base clamp to cell 0,
    // whose entry is 0 (the cell starts at 2^e <= level[1]). Signed index,
    // integer clamps and unconditional loads (j + 1 <= m): gcc vectorises this.
    int32_t c = (int32_t(f32_bits(a)) - int32_t(t.cell_base)) >> t.cell_shift;
    c = c < 0 ? 0 : c;
    c = c < t.ncells - 1 ? c : t.ncells - 1;
    int32_t j = t.cell[c];
    const int32_t next = int32_t(f32_bits(t.level[j + 1]));
    j += ((j < t.m - 1) & (int32_t(f32_bits(a)) >= next)) ? 1 : 0;
    return j;
  }
}

// The steps of coding one value x (b >= 2), normalised by inv, with random
// word w and stratum pi. dq_encode_value composes them; the CUDA kernel runs
// it per element; the CPU runs the steps in one AVX2 loop (widths 2, 4, 8)
// or, where that does not apply, as separate auto-vectorised passes.
DQ_HD uint32_t dq_sign(float x) { return x < 0.0f ? 1u : 0u; }

// a = min(|x| * inv, 1), the clamp on the bit pattern (nan -> 1)
DQ_HD float dq_normalise(float x, float inv) {
  const uint32_t ab = f32_bits(fabsf(x) * inv);
  return bits_f32(ab < 0x3f800000u ? ab : 0x3f800000u);
}

// Probability of rounding the magnitude up from level[j].
DQ_HD float dq_frac(const DqLevels& t, float a, int32_t j) {
  return (a - t.level[j]) * t.invgap[j];
}

template <int B>
DQ_HD uint32_t dq_code(uint32_t neg, int32_t j, uint32_t up) {
  return (neg << (B - 1)) | (uint32_t(j) + up);
}

template <int B>
DQ_HD uint32_t dq_encode_value(const DqLevels& t, float x, float inv, float pi, uint32_t w,
                               const DqRounding& rd) {
  const uint32_t neg = dq_sign(x);
  const float a = dq_normalise(x, inv);
  const int32_t j = dq_bracket<B>(t, a);
  const float p = dq_frac(t, a, j);
  return dq_code<B>(neg, j, dq_round_up(p, pi, w, neg, rd));
}

// Width 1: sign only, at +-scale; P(+) = (1 + x/norm)/2, so E = x.
DQ_HD uint32_t dq_encode_sign(float x, float inv, float pi, uint32_t w, const DqRounding& rd) {
  // a = x * inv clamped to [-1, 1] on the bit pattern (nan -> +-1)
  const uint32_t ab = f32_bits(x * inv);
  const uint32_t mag = ab & 0x7fffffffu;
  const float a = bits_f32((mag < 0x3f800000u ? mag : 0x3f800000u) | (ab & 0x80000000u));
  const float p = (1.0f + a) * 0.5f;
  return dq_round_up(p, pi, w, 0u, rd);  // already oriented: up = +scale
}

// Code of element i inside an SG's packed code bytes (planar packing: byte k
// holds elements k + j*(S*b/8) in bits [j*b, (j+1)*b)).
DQ_HD uint32_t dq_code_at(const uint8_t* codes, int32_t S, int32_t B, int32_t i) {
  const int32_t nb = S * B / 8;
  return (uint32_t(codes[i % nb]) >> ((i / nb) * B)) & ((1u << B) - 1u);
}

// Decoded group scale k of an SG from its scale bytes.
DQ_HD float dq_read_group_scale(const uint8_t* sg, const DynamiqFormat& f, const float* r255,
                                int32_t k) {
  if (f.hierarchical) {
    const float Msg = bf16_to_f32(load_u16(sg));
    return r255[sg[2 + k]] * Msg;
  }
  return bf16_to_f32(load_u16(sg + 2 * k));
}

// Value of element i of an SG of width B (B in 1,2,4,8,16) at `sg` (its first byte).
DQ_HD float dq_decode_element(const uint8_t* sg, int32_t B, const DynamiqFormat& f,
                              const DqTables& tb, int32_t i) {
  if (B == 16) return bf16_to_f32(load_u16(sg + 2 * i));
  const uint8_t* codes = sg + dynamiq_scale_bytes(B, f);
  const float sc = dq_read_group_scale(sg, f, tb.r255, i / f.s);
  return tb.lv[dynamiq_width_index(B)].decode[dq_code_at(codes, f.S, B, i)] * sc;
}

// ---- statistics -------------------------------------------------------------------
// Sums in double over 8 lanes (lane l takes elements l, l+8, ... in order),
// combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): a fixed order the CUDA
// kernel reproduces, so both give the same bits.
constexpr int kStatLanes = 8;

DQ_HD double dq_combine_lanes(const double* v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

DQ_HD float dq_saturate(double v) {
  const double fmax = 3.4028234663852886e38;
  if (v > fmax) return 3.4028234663852886e38f;
  if (v < -fmax) return -3.4028234663852886e38f;
  // NaN as one fixed pattern: a GPU makes every NaN 0x7fffffff, x86 keeps the
  // payload and sign or makes 0xffc00000, and the statistics must be the same
  // bits on both
  if (v != v) return bits_f32(0x7fc00000u);
  return float(v);
}

}  // namespace dynamiq
