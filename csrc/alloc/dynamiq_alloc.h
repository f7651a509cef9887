// DynamiQ bit allocation (paper section 3.2 and appendix A): a width per
// super-group (SG) from the all-reduced per-SG sums of squares F_j, under a
// budget of `bits` per coordinate that includes every byte the wire carries
// (codes, group scales, SG scale; csrc/kernels/dynamiq/dynamiq_format.h).
//
// Both solvers use the same one-parameter family of threshold rules. For
// consecutive allowed widths a < b the threshold is
//     T(a,b) = C * K(a,b),   K(a,b) = 4^b (b - a) / (4^(b-a) - 1),
// and an SG gets the widest width b whose T(a,b) <= F_j (the narrowest allowed
// width if none). K follows from the paper's per-bit-benefit argument: moving
// an SG with F = T(a,b) from a to b bits lowers its error proxy F 4^-w by
// T(a,b) (4^-a - 4^-b) for (b - a) more bits per coordinate; requiring the
// same benefit per bit, T(a,b) (4^(b-a) - 1) / (4^b (b - a)) = 1/C, at every
// threshold gives the formula. It reproduces the paper's ratios
// T(1,2) = 5/32 T(2,4), T(2,4) = 17/512 T(4,8), T(4,8) = 257/2^17 T(8,16), and
// covers any subset (for {2, 8}: K(2,8) = 4^8 * 6 / 4095).
//
// The single degree of freedom is the scale C (equivalently u, below). Larger
// C means higher thresholds, fewer bits. The wire cost is a non-increasing
// step function of C; the solvers look for the smallest C whose cost fits.
//  - exact: the smallest such C, found by bisection over every double C
//    with a histogram of F (1/16-octave bins) and a sort of only the bins the
//    thresholds cross: the tightest rule of the family, O(num_sg).
//  - fast (appendix A): starts from the offset u carried across steps and
//    brackets/bisects it with at most `max_passes` counting passes over F
//    (no histogram, no sort); on the first step (no u yet) it runs the exact
//    search once, and so does a step whose bracket is not found within
//    `max_passes` (the statistics moved by more than about 5 % since the
//    last step; AllocResult::exact_fallback). Always within budget, never more bits than the exact
//    solver SG by SG (same family, C >= C*); on a stationary stream u
//    settles within 2^-16 of the exact solver's. It generalises the paper's
//    closed form
//      q_j = 2^clamp([1,3], floor(log2(4/log2(512/17) * log2 F_j + u_paper)))
//    (which is this rule for W = {2,4,8}, u_paper = 4 - 4/log2(512/17) *
//    log2 T(2,4)) to any set of allowed widths, so no fallback is needed.
//
// Ties: a threshold rule gives SGs with equal F the same width, so when the
// smallest C that fits leaves budget over because the next smaller C would
// upgrade a whole set of equal SGs at once (a pattern repeated across a
// bucket), both solvers then take the upgrades a smaller C would make, in the
// order lowering C makes them (each upgrade enters the rule at the largest C
// with C * K <= F, computed with the rule's own double product), a set of
// upgrades entering at the same C at a time: whole while it fits, and of the
// first set that does not, each upgrade in SG order that still fits
// (AllocResult::tie_promoted). The exact solver's result is the rule at its C
// plus those of the next set (in practice: of the next equal statistics); the
// fast solver walks from its last over-budget probe (at most 16 sets, or 1
// when its bracket did not close and the window is large) and, when the walk
// gets to the set that does not fit whole, ends at the same widths.
//
// Determinism: the result depends only on the F values, the parameters and
// the state, through integer arithmetic, IEEE float/double compares and one
// correctly rounded multiplication per threshold. No libm call (log2/exp2
// differ between glibc's CPU-dispatched variants), no reduction whose order
// depends on threads. Every rank computes the same widths from the same stats.
// Assumes IEEE float semantics (no -ffast-math: NaN tests and the exact
// compares rely on it).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/base/common.h"
#include "kernels/dynamiq/dynamiq_format.h"
#include "kernels/base/float_bits.h"

namespace dynamiq {

// All widths the format knows, as a mask with bit w set for width w.
constexpr uint32_t kDynamiqWidthMaskAll = (1u << 1) | (1u << 2) | (1u << 4) | (1u << 8) | (1u << 16);
constexpr uint32_t kDynamiqWidthMaskDefault = (1u << 2) | (1u << 4) | (1u << 8);
constexpr float kFloatMax = 3.40282346638528859811704183484516925e+38f;

// K(a,b) above, for widths a < b in {1,2,4,8,16}. Integer powers, one division:
// the same double on every platform.
DQ_HD double dynamiq_threshold_factor(int a, int b) {
  const double four_b = double(uint64_t(1) << (2 * b));
  const double four_ba_minus_1 = double((uint64_t(1) << (2 * (b - a))) - 1);
  return four_b * double(b - a) / four_ba_minus_1;
}

// How the allocator reads one statistic: NaN as the largest value (a
// non-finite SG should never get fewer bits than a finite one; the driver
// falls back to the exact path for non-finite data anyway), +inf (a finite SG
// whose sum of squares overflowed) as FLT_MAX, anything not > 0 (including
// -0) as +0. The result is a non-negative finite float, so its bit pattern
// orders like its value.
DQ_HD float dynamiq_sanitize_stat(float f) {
  if (f != f) return kFloatMax;
  if (!(f > 0.0f)) return 0.0f;
  return f < kFloatMax ? f : kFloatMax;
}

// The smallest float >= t, for t >= 0 (t may be +inf). With it,
// (float F >= float_ceil(t)) <=> (double(F) >= t) for every float F, so the
// per-SG comparisons can run in float.
DQ_HD float dynamiq_float_ceil(double t) {
  if (!(t > 0.0)) return 0.0f;
  if (t > double(kFloatMax)) return bits_f32(0x7f800000u);
  float f = float(t);
  if (double(f) < t) f = bits_f32(f32_bits(f) + 1u);
  return f;
}

// The allowed widths in increasing order.
struct WidthSet {
  int count = 0;
  int w[5] = {0, 0, 0, 0, 0};
};

// Width of one SG given its sanitised statistic and the float thresholds
// tf[p] between ws.w[p] and ws.w[p+1] (non-decreasing).
DQ_HD int dynamiq_width_for(float f, const WidthSet& ws, const float* tf) {
  int idx = 0;
  for (int p = 0; p + 1 < ws.count; ++p) idx += f >= tf[p] ? 1 : 0;
  return ws.w[idx];
}

enum class AllocSolver : uint8_t { kExact = 0, kFast = 1 };

struct AllocParams {
  double bits = 5.0;                                  // budget per coordinate, all metadata included
  uint32_t widths_mask = kDynamiqWidthMaskDefault;    // bit w set: width w allowed
  DynamiqFormat format{};
  AllocSolver solver = AllocSolver::kFast;
  // Fast solver: counting passes over F per step once u is known (each pass
  // is one read of the num_sg floats). The tie fill adds its own
  // (AllocResult::fill_passes).
  int max_passes = 8;
};

// Fast-solver state carried across steps, per bucket.
//   u:    the offset. Thresholds are T(a,b) = K(a,b) * C with C the double
//         whose bit pattern is 0x3FF0000000000000 - u * 2^52, i.e.
//         log2 C ~= -u (exact at integer u; piecewise linear in between, a
//         monotone map that needs no libm). Larger u, more bits.
//   step: width of the last bracket around the best u (a hint for the next
//         step's first probe; 0 = default).
struct AllocState {
  bool has_u = false;
  double u = 0.0;
  double step = 0.0;
};

struct AllocResult {
  int64_t num_sg = 0;
  int64_t width_count[5] = {0, 0, 0, 0, 0};  // SGs per width, index dynamiq_width_index(w)
  int64_t wire_bytes = 0;                    // sum of dynamiq_sg_bytes over SGs
  double budget_bits = 0.0;                  // bits * numel
  double bits_per_coord = 0.0;               // 8 * wire_bytes / numel
  // Thresholds between consecutive allowed widths: SGs with F >= threshold[p]
  // get at least width_hi[p]; threshold[p] = scale * K(width_lo[p], width_hi[p]).
  // SGs below it get width_lo[p] except those of the tie_promoted upgrades
  // (see "Ties" above).
  int num_thresholds = 0;
  int width_lo[4] = {0, 0, 0, 0};
  int width_hi[4] = {0, 0, 0, 0};
  double threshold[4] = {0, 0, 0, 0};
  double scale = 0.0;  // C (0: everything at the widest width)
  double u = 0.0;      // u of `scale` (see AllocState), in [-1024, 1023]
  int passes = 0;      // cost evaluations (fast warm step: passes over F; exact: bisection steps)
  // One-width upgrades beyond the thresholds' widths ("Ties" above), and the
  // passes over all SGs that took (not in `passes`): none when less than one
  // upgrade of budget is left, else 2 for a small window (then passes over
  // the window only), 1 + 2 per set walked for a large one (at most 9).
  int64_t tie_promoted = 0;
  int fill_passes = 0;
  // Fast solver, warm step: the bracket around the carried u was not found
  // within max_passes (the statistics moved too far), so the step searched
  // exactly (its passes then include the exact search's).
  bool exact_fallback = false;
  // An exact search ran: the exact solver, the fast solver's first step, or
  // its fallback (not the C = 0 case, where the budget fits every SG at the
  // widest width and nothing is searched).
  bool exact_search = false;
};

// Validated allowed widths. Throws Error for an empty mask, a width outside
// {1,2,4,8,16}, or a format where wider SGs do not cost more bytes.
WidthSet dynamiq_width_set(uint32_t widths_mask, const DynamiqFormat& fmt);

// Number of SGs of a bucket: ceil(numel / S).
int64_t dynamiq_num_sg(int64_t numel, const DynamiqFormat& fmt);

// Bits per coordinate with every SG at the narrowest allowed width: the
// smallest budget `dynamiq_allocate` accepts for this bucket.
double dynamiq_min_feasible_bits(int64_t numel, uint32_t widths_mask, const DynamiqFormat& fmt);

// The allocator's budget test, the only one: `wire_bytes` fit a budget of
// `bits` per coordinate over `numel` coordinates iff 8 * wire_bytes <=
// bits * numel (double compare; false for a NaN budget).
inline bool dynamiq_fits_budget(int64_t wire_bytes, double bits, int64_t numel) {
  return double(8 * wire_bytes) <= bits * double(numel);
}

// True iff `dynamiq_allocate` accepts the budget for a bucket of `numel`
// elements: every SG at the narrowest allowed width (a partial last SG padded
// to S on the wire) fits it. dynamiq_allocate throws exactly when this is
// false (for valid parameters), so the driver can route such a bucket to the
// exact path before planning. Throws Error on bad widths or format.
bool dynamiq_budget_feasible(int64_t numel, double bits, uint32_t widths_mask, const DynamiqFormat& fmt);

// Widths per SG: widths_out[j] for j < dynamiq_num_sg(numel). `sumsq[j *
// stride]` is F_j, the all-reduced sum of squares of SG j. Guarantees
// 8 * wire_bytes <= bits * numel. Throws Error if even the narrowest width
// does not fit (the message names the minimum feasible bits) or on bad
// parameters. The fast solver reads and updates `state`; the exact solver
// ignores it.
AllocResult dynamiq_allocate(const float* sumsq, int64_t numel, const AllocParams& params,
                             AllocState& state, uint8_t* widths_out, int64_t stride = 1);

// The u <-> C map of AllocState (exposed for tests and logs).
double dynamiq_scale_of_u(double u);
double dynamiq_u_of_scale(double scale);

}  // namespace dynamiq
