// The two width solvers of dynamiq_alloc.h. Both search the scale C of the
// threshold rule through the bit pattern k of the double C: for C >= 0 the
// pattern is an integer that orders like C (k = 0 is C = 0, everything at the
// widest width; k = 0x7FF0000000000000 is C = +inf, everything at the
// narrowest), so a search over k is a search over C with no libm.
#include "alloc/dynamiq_alloc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace dynamiq {

namespace {

constexpr int64_t kPatternOne = 0x3FF0000000000000LL;  // bit pattern of 1.0
constexpr int64_t kPatternInf = 0x7FF0000000000000LL;  // bit pattern of +inf
constexpr double kTwo52 = 4503599627370496.0;
// The fast solver moves k on a grid of 2^10 so that u = (kPatternOne - k) / 2^52
// holds every k exactly (at most 52 significant bits) and state round-trips.
constexpr int64_t kGrid = int64_t(1) << 10;
// Smallest first step of the fast solver's bracket: 2^-16 in u (C within a
// factor 1.00001), and the largest (beyond the whole range of C).
constexpr int64_t kStepMin = int64_t(1) << 36;
constexpr int64_t kStepMax = int64_t(1) << 60;
// A warm step whose final bracket is wider than this (2^-6 in u, C within
// 1.1 %) searches exactly instead (see dynamiq_allocate).
constexpr int64_t kFallbackWidth = int64_t(1) << 46;

double scale_of_k(int64_t k) {
  double c;
  std::memcpy(&c, &k, sizeof c);
  return c;
}

int64_t k_of_scale(double c) {
  int64_t k;
  std::memcpy(&k, &c, sizeof k);
  return k;
}

double u_of_k(int64_t k) { return double(kPatternOne - k) / kTwo52; }

int64_t grid_down(int64_t k) { return k & ~(kGrid - 1); }

// Thresholds of the rule at pattern k.
struct Rule {
  int nt = 0;
  double t[4] = {0, 0, 0, 0};
  float tf[4] = {0, 0, 0, 0};
};

struct Problem {
  WidthSet ws;
  double factor[4] = {0, 0, 0, 0};  // K(w[p], w[p+1])
  int64_t sg_bytes[5] = {0, 0, 0, 0, 0};
  int64_t num_sg = 0;
  double bits = 0.0;   // budget per coordinate
  int64_t numel = 0;

  Rule rule(int64_t k) const {
    Rule r;
    r.nt = ws.count - 1;
    const double c = scale_of_k(k);
    for (int p = 0; p < r.nt; ++p) {
      r.t[p] = c * factor[p];
      r.tf[p] = dynamiq_float_ceil(r.t[p]);
    }
    return r;
  }
  // Wire bytes given, per threshold, the number of SGs at or above it.
  int64_t bytes(const int64_t* at_or_above) const {
    int64_t b = num_sg * sg_bytes[0];
    for (int p = 0; p + 1 < ws.count; ++p) b += at_or_above[p] * (sg_bytes[p + 1] - sg_bytes[p]);
    return b;
  }
  bool fits(int64_t wire_bytes) const { return dynamiq_fits_budget(wire_bytes, bits, numel); }
};

// ---- passes over the sanitised statistics (vectorised inner loops) ----------

void sanitize(const float* src, int64_t n, int64_t stride, float* dst) {
  if (stride == 1) {
    for (int64_t j = 0; j < n; ++j) dst[j] = dynamiq_sanitize_stat(src[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j] = dynamiq_sanitize_stat(src[j * stride]);
  }
}

// Number of f[j] >= tf[p], per p. int32 lane counters over blocks of 2^20 so
// that the loop vectorises (compare -> mask -> subtract).
template <int NT>
void count_at_or_above(const float* f, int64_t n, const float* tf, int64_t* out) {
  const float t0 = tf[0], t1 = NT > 1 ? tf[1] : 0.f, t2 = NT > 2 ? tf[2] : 0.f,
              t3 = NT > 3 ? tf[3] : 0.f;
  int64_t tot[4] = {0, 0, 0, 0};
  constexpr int64_t kBlock = int64_t(1) << 20;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    int32_t c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    for (int64_t j = b; j < e; ++j) {
      const float x = f[j];
      c0 += x >= t0;
      if constexpr (NT > 1) c1 += x >= t1;
      if constexpr (NT > 2) c2 += x >= t2;
      if constexpr (NT > 3) c3 += x >= t3;
    }
    tot[0] += c0, tot[1] += c1, tot[2] += c2, tot[3] += c3;
  }
  for (int p = 0; p < NT; ++p) out[p] = tot[p];
}

void count_pass(const float* f, int64_t n, const Rule& r, int64_t* out) {
  switch (r.nt) {
    case 1: count_at_or_above<1>(f, n, r.tf, out); break;
    case 2: count_at_or_above<2>(f, n, r.tf, out); break;
    case 3: count_at_or_above<3>(f, n, r.tf, out); break;
    case 4: count_at_or_above<4>(f, n, r.tf, out); break;
    default: break;
  }
}

// widths[j] = w[0] + sum_p [f[j] >= tf[p]] (w[p+1] - w[p]), which equals
// dynamiq_width_for(f[j], ...) and vectorises (no table lookup).
template <int NT>
void assign_widths(const float* f, int64_t n, const float* tf, const WidthSet& ws, uint8_t* out) {
  const float t0 = tf[0], t1 = NT > 1 ? tf[1] : 0.f, t2 = NT > 2 ? tf[2] : 0.f,
              t3 = NT > 3 ? tf[3] : 0.f;
  const uint8_t w0 = uint8_t(ws.w[0]);
  const uint8_t d0 = uint8_t(ws.w[1] - ws.w[0]);
  const uint8_t d1 = NT > 1 ? uint8_t(ws.w[2] - ws.w[1]) : 0;
  const uint8_t d2 = NT > 2 ? uint8_t(ws.w[3] - ws.w[2]) : 0;
  const uint8_t d3 = NT > 3 ? uint8_t(ws.w[4] - ws.w[3]) : 0;
  for (int64_t j = 0; j < n; ++j) {
    const float x = f[j];
    uint8_t w = uint8_t(w0 + (x >= t0 ? d0 : 0));
    if constexpr (NT > 1) w = uint8_t(w + (x >= t1 ? d1 : 0));
    if constexpr (NT > 2) w = uint8_t(w + (x >= t2 ? d2 : 0));
    if constexpr (NT > 3) w = uint8_t(w + (x >= t3 ? d3 : 0));
    out[j] = w;
  }
}

void assign_pass(const float* f, int64_t n, const Rule& r, const WidthSet& ws, uint8_t* out) {
  switch (r.nt) {
    case 0: std::fill(out, out + n, uint8_t(ws.w[0])); break;
    case 1: assign_widths<1>(f, n, r.tf, ws, out); break;
    case 2: assign_widths<2>(f, n, r.tf, ws, out); break;
    case 3: assign_widths<3>(f, n, r.tf, ws, out); break;
    case 4: assign_widths<4>(f, n, r.tf, ws, out); break;
    default: break;
  }
}

// LSD radix sort of non-negative finite floats (their bit patterns order like
// their values, and are < 2^31): four passes of 8 bits (256 buckets keep the
// scatter's write streams in L1), a pass skipped when all keys share its digit.
void radix_sort_nonneg(std::vector<float>& v) {
  const size_t n = v.size();
  if (n < 2) return;
  std::vector<uint32_t> a(n), b(n);
  std::memcpy(a.data(), v.data(), n * 4);
  std::vector<uint32_t> hist(4 * 256, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = a[i];
    ++hist[x & 0xffu];
    ++hist[256 + ((x >> 8) & 0xffu)];
    ++hist[512 + ((x >> 16) & 0xffu)];
    ++hist[768 + (x >> 24)];
  }
  for (int d = 0; d < 4; ++d) {
    uint32_t* h = hist.data() + 256 * d;
    const int shift = 8 * d;
    if (h[(a[0] >> shift) & 0xffu] == n) continue;
    uint32_t sum = 0;
    for (int i = 0; i < 256; ++i) {
      const uint32_t c = h[i];
      h[i] = sum;
      sum += c;
    }
    for (size_t i = 0; i < n; ++i) {
      const uint32_t x = a[i];
      b[h[(x >> shift) & 0xffu]++] = x;
    }
    a.swap(b);
  }
  std::memcpy(v.data(), a.data(), n * 4);
}

std::string fmt_bits(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// Bisection of (a, b] (a < b) for a predicate false up to some k and true from
// there on, taken as true at b: that k (b if none below). Ends with a window
// of one, so the k before it is the largest in [a, b) where it is false.
template <class Fits>
int64_t first_fitting(int64_t a, int64_t b, Fits fits) {
  while (b - a > 1) {
    const int64_t mid = a + (b - a) / 2;
    if (fits(mid)) b = mid;
    else a = mid;
  }
  return b;
}

// Exact solver: the smallest pattern k (smallest C) whose cost fits, given
// that k = 0 does not fit and k = +inf does. Sorting every statistic would do
// (cost = binary searches), but only the statistics near the final
// thresholds matter:
//  1. a histogram over 4080 bins of 1/16 octave (top 12 bits of the pattern)
//     bounds the count at or above any threshold by whole bins; bisections on
//     these bounds give k_lo (certainly over budget) < k* <= k_hi (certainly
//     within budget);
//  2. only the bins that some threshold crosses between k_lo and k_hi are
//     gathered and sorted, and a last bisection on (k_lo, k_hi] uses exact
//     counts: whole bins above the range plus a binary search inside it.
// The result equals the full-sort bisection; the work is two passes plus a
// sort of a few bins (all of them only if the data sits in a few bins).
int64_t exact_search(const std::vector<float>& f, const Problem& pr, int& passes) {
  constexpr int kShift = 19;
  const int64_t nb = int64_t(f32_bits(kFloatMax) >> kShift) + 1;  // bins of finite values; +inf -> nb
  const int64_t n = int64_t(f.size());
  const int nt = pr.ws.count - 1;
  auto bin_of = [&](float x) { return std::min<int64_t>(int64_t(f32_bits(x) >> kShift), nb); };
  std::vector<int64_t> suffix(size_t(nb) + 2, 0);  // suffix[b] = #values in bins >= b
  {
    std::vector<uint32_t> h(size_t(nb), 0);
    for (int64_t j = 0; j < n; ++j) ++h[size_t(f32_bits(f[size_t(j)]) >> kShift)];
    for (int64_t b = nb - 1; b >= 0; --b) suffix[size_t(b)] = suffix[size_t(b) + 1] + h[size_t(b)];
  }
  // Byte bounds at k from whole bins: the bin holding a threshold counts as
  // entirely below it (lo) or entirely at or above it (hi).
  auto bounds = [&](int64_t k, int64_t& lo_bytes, int64_t& hi_bytes) {
    const Rule r = pr.rule(k);
    int64_t lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
    for (int p = 0; p < nt; ++p) {
      const int64_t b = bin_of(r.tf[p]);
      if (r.tf[p] == 0.0f) lo[p] = hi[p] = n;
      else if (b < nb) lo[p] = suffix[size_t(b) + 1], hi[p] = suffix[size_t(b)];
    }
    ++passes;
    lo_bytes = pr.bytes(lo), hi_bytes = pr.bytes(hi);
  };
  int64_t lo_b, hi_b;
  // k_hi: smallest k whose upper bound fits
  const int64_t k_hi = first_fitting(0, kPatternInf, [&](int64_t k) {
    bounds(k, lo_b, hi_b);
    return pr.fits(hi_b);
  });
  // k_lo: largest k < k_hi whose lower bound does not fit
  const int64_t k_lo = first_fitting(0, k_hi, [&](int64_t k) {
    bounds(k, lo_b, hi_b);
    return pr.fits(lo_b);
  }) - 1;

  // Bins crossed by each threshold for k in [k_lo, k_hi].
  const Rule r_lo = pr.rule(k_lo), r_hi = pr.rule(k_hi);
  int64_t blo[4] = {0, 0, 0, 0}, bhi[4] = {-1, -1, -1, -1};
  std::vector<uint8_t> take(size_t(nb) + 1, 0);
  for (int p = 0; p < nt; ++p) {
    blo[p] = bin_of(r_lo.tf[p]);
    bhi[p] = std::min(bin_of(r_hi.tf[p]), nb - 1);
    for (int64_t x = blo[p]; x <= bhi[p]; ++x) take[size_t(x)] = 1;
  }
  std::vector<float> sub;
  for (int64_t j = 0; j < n; ++j)
    if (take[size_t(bin_of(f[size_t(j)]))]) sub.push_back(f[size_t(j)]);
  radix_sort_nonneg(sub);
  auto cost = [&](int64_t k) {
    const Rule r = pr.rule(k);
    int64_t above[4] = {0, 0, 0, 0};
    for (int p = 0; p < nt; ++p) {
      if (r.tf[p] == 0.0f) {
        above[p] = n;
      } else if (bin_of(r.tf[p]) < nb) {
        // Every value of bins blo..bhi is in `sub`; those above bhi are counted whole.
        const float end = bits_f32(uint32_t(bhi[p] + 1) << kShift);
        above[p] = suffix[size_t(bhi[p]) + 1] + (std::lower_bound(sub.begin(), sub.end(), end) -
                                                  std::lower_bound(sub.begin(), sub.end(), r.tf[p]));
      }
    }
    ++passes;
    return pr.bytes(above);
  };
  return first_fitting(k_lo, k_hi, [&](int64_t k) { return pr.fits(cost(k)); });
}

// Per threshold p < nt, the largest f[j] in [lo[p], hi[p]) (0 if none), in
// one pass. The statistics are sanitised (finite, >= 0) and the bounds >= 0,
// so their bit patterns order like their values: integer compares and maxima
// vectorise where float ones under -ftrapping-math stay branches.
template <int NT>
void window_max_n(const float* f, int64_t n, const float* lo, const float* hi, float* out) {
  int32_t lb[4] = {0, 0, 0, 0}, hb[4] = {0, 0, 0, 0};
  for (int p = 0; p < NT; ++p) lb[p] = int32_t(f32_bits(lo[p])), hb[p] = int32_t(f32_bits(hi[p]));
  int32_t m0 = 0, m1 = 0, m2 = 0, m3 = 0;
  for (int64_t j = 0; j < n; ++j) {
    int32_t xb;
    std::memcpy(&xb, f + j, 4);
    const int32_t v0 = (xb >= lb[0]) & (xb < hb[0]) ? xb : 0;
    m0 = v0 > m0 ? v0 : m0;
    if constexpr (NT > 1) {
      const int32_t v1 = (xb >= lb[1]) & (xb < hb[1]) ? xb : 0;
      m1 = v1 > m1 ? v1 : m1;
    }
    if constexpr (NT > 2) {
      const int32_t v2 = (xb >= lb[2]) & (xb < hb[2]) ? xb : 0;
      m2 = v2 > m2 ? v2 : m2;
    }
    if constexpr (NT > 3) {
      const int32_t v3 = (xb >= lb[3]) & (xb < hb[3]) ? xb : 0;
      m3 = v3 > m3 ? v3 : m3;
    }
  }
  const int32_t m[4] = {m0, m1, m2, m3};
  for (int p = 0; p < NT; ++p) out[p] = bits_f32(uint32_t(m[p]));
}

void window_max(const float* f, int64_t n, int nt, const float* lo, const float* hi, float* out) {
  switch (nt) {
    case 1: window_max_n<1>(f, n, lo, hi, out); break;
    case 2: window_max_n<2>(f, n, lo, hi, out); break;
    case 3: window_max_n<3>(f, n, lo, hi, out); break;
    case 4: window_max_n<4>(f, n, lo, hi, out); break;
    default: break;
  }
}

// The largest pattern k at which the rule upgrades an SG with statistic F
// across a threshold of factor K: the rule at k has threshold t = C(k) * K
// (a double product) and upgrades iff double(F) >= t (dynamiq_float_ceil).
// Lowering C from k_final makes the upgrades in decreasing order of this k,
// equal k at once: the order a walk must follow to end where the rule at a
// smaller C would. Starts from F / K and moves a few ulps to the exact edge.
int64_t entry_k(float F, double K) {
  const double fd = double(F);
  int64_t k = std::min(std::max(k_of_scale(fd / K), int64_t(0)), kPatternInf);
  while (k > 0 && !(scale_of_k(k) * K <= fd)) --k;
  while (k + 1 < kPatternInf && scale_of_k(k + 1) * K <= fd) ++k;
  return k;
}

// Ties at the margin. The rule at k (the chosen C) fits; the rule at some
// k_prev < k (a smaller C) does not. Lowering C from k to k_prev upgrades SGs
// one threshold crossing ("event": SG j from w[p] to w[p+1]) at a time: an
// event enters the rule at entry_k(F_j, K_p), events with equal entry at once
// (SGs with equal F always do), which is why a pure threshold rule can leave
// most of the budget unused (a pattern repeated across a bucket: 64 equal SGs
// at 4.5 bits all stay at 2 bits). This walks the events between the two rules
// ("the window") level by level, a level being the events of one entry, the
// largest first: a level that fits whole is applied whole (that is just a
// smaller C); in the first level that does not, the events are applied in SG
// order, each if it still fits (and its SG is at w[p]: its lower crossing may
// be in the same level and not have fitted), and the walk ends there. So the
// exact solver's result (k_prev = k - 1) is the rule at the smallest C that
// fits plus, in SG order, as many as fit of the upgrades entering at the next
// C. Deterministic (every rank walks the same statistics in the same order),
// never over budget, a larger F never gets fewer bits (within a level an SG
// at a higher threshold is already at least as wide as any the level lifts
// below it), and SGs with F = 0 (constant after the mean) are never upgraded.
// Cost: the budget left decides at once in most calls (less than one upgrade
// left); otherwise one counting pass sizes the window. A small window (up to
// kMaxGathered events or 1/16 of the SGs) is gathered in one pass and each of
// at most kMaxLevels levels is a pass over it. A large one (ties across the
// bucket, or the fast solver's bracket left open by a jump in the statistics)
// is walked by two passes over all SGs per level, for at most 4 levels, or 1
// when the bracket is open (`closed` false). The fast solver passes its last
// over-budget probe; when its walk reaches the level that does not fit whole,
// it ends at the exact solver's widths.
// Returns the number of upgrades made; updates widths, counts, bytes and
// fill_passes (its passes over all SGs).
int64_t fill_margin(const float* f, const Problem& pr, const Rule& r, const int64_t* at, const Rule& prev,
                    bool closed, uint8_t* widths, int64_t* count, int64_t& bytes, int& fill_passes) {
  constexpr int kMaxLevels = 16;
  constexpr int64_t kMaxGathered = 4096;  // (or 1/16 of the SGs)
  const int nt = pr.ws.count - 1;
  bool step_fits[4] = {false, false, false, false}, room = false;
  for (int p = 0; p < nt; ++p) room |= step_fits[p] = pr.fits(bytes + pr.sg_bytes[p + 1] - pr.sg_bytes[p]);
  if (!room) return 0;
  int64_t at_prev[4] = {0, 0, 0, 0};
  count_pass(f, pr.num_sg, prev, at_prev);
  ++fill_passes;
  int64_t window = 0;
  bool any = false;
  for (int p = 0; p < nt; ++p) {
    window += at_prev[p] - at[p];
    any |= at_prev[p] > at[p] && step_fits[p];
  }
  if (!any) return 0;
  int64_t applied = 0;
  // SG j from w[p] to w[p+1] if it is at w[p] (its lower crossing may be in
  // the same level and not have fitted) and the budget allows.
  auto upgrade = [&](int64_t j, int p) {
    const int64_t nb = bytes + pr.sg_bytes[p + 1] - pr.sg_bytes[p];
    if (widths[j] != pr.ws.w[p] || !pr.fits(nb)) return false;
    widths[j] = uint8_t(pr.ws.w[p + 1]);
    --count[p];
    ++count[p + 1];
    bytes = nb;
    ++applied;
    return true;
  };
  if (window > std::max(kMaxGathered, pr.num_sg / 16)) {
    // A large window: levels found and applied by passes over all SGs (two
    // per level), at most a few (closed: the one-ulp margin holds a value per
    // threshold) or, for an open bracket, one: the first set of upgrades,
    // which is the whole tie when the statistics tie (all SGs equal).
    // cur[p]: the threshold p after the levels applied so far. An SG with
    // F = fmax[p] is at width w[p] unless its crossing of p-1 (entry_k at
    // least as large) is in this level too and did not fit.
    float cur[4] = {r.tf[0], r.tf[1], r.tf[2], r.tf[3]};
    const int levels = closed ? 4 : 1;
    for (int level = 0; level < levels; ++level) {
      float fmax[4] = {0, 0, 0, 0};  // largest F of the window left, per threshold (0: none)
      window_max(f, pr.num_sg, nt, prev.tf, cur, fmax);
      int64_t ke[4] = {-1, -1, -1, -1}, kmax = -1;
      for (int p = 0; p < nt; ++p)
        if (fmax[p] > 0.0f) kmax = std::max(kmax, ke[p] = entry_k(fmax[p], pr.factor[p]));
      if (kmax < 0) break;
      bool on[4] = {false, false, false, false};
      for (int p = 0; p < nt; ++p) on[p] = ke[p] == kmax;
      bool skipped = false;
      // this level's values as bit patterns (-1: no sanitised F has it)
      int32_t lv[4] = {-1, -1, -1, -1};
      for (int p = 0; p < nt; ++p) lv[p] = on[p] ? int32_t(f32_bits(fmax[p])) : -1;
      for (int64_t j = 0; j < pr.num_sg; ++j) {
        int32_t xb;
        std::memcpy(&xb, f + j, 4);
        if (!((xb == lv[0]) | (xb == lv[1]) | (xb == lv[2]) | (xb == lv[3]))) continue;
        for (int p = 0; p < nt; ++p)
          if (xb == lv[p] && !upgrade(j, p)) skipped = true;
      }
      fill_passes += 2;
      if (skipped) break;
      for (int p = 0; p < nt; ++p)
        if (on[p]) cur[p] = fmax[p];
    }
    return applied;
  }
  // A small window: its upgrades gathered in one pass, then each level is a
  // pass over them only.
  struct Event {
    int64_t k;  // entry_k: the level
    int64_t j;
    int p;
  };
  std::vector<Event> ev;
  ev.reserve(size_t(window));
  // bit patterns (see window_max_n); the window is [prev.tf[p], r.tf[p]) per p,
  // and prev.tf[0] <= prev.tf[p]: an SG below it is in no window
  int32_t lb[4] = {0, 0, 0, 0}, hb[4] = {0, 0, 0, 0};
  for (int p = 0; p < nt; ++p) lb[p] = int32_t(f32_bits(prev.tf[p])), hb[p] = int32_t(f32_bits(r.tf[p]));
  for (int64_t j = 0; j < pr.num_sg; ++j) {  // SG order; an SG's lower threshold first
    int32_t xb;
    std::memcpy(&xb, f + j, 4);
    bool in = false;  // (one rarely taken branch: the window is small here)
    for (int p = 0; p < nt; ++p) in |= (xb < hb[p]) & (xb >= lb[p]);
    if (!in || xb == 0) continue;
    for (int p = 0; p < nt; ++p)
      if ((xb < hb[p]) & (xb >= lb[p])) ev.push_back({entry_k(f[j], pr.factor[p]), j, p});
  }
  ++fill_passes;
  // K_p grows with p, so an SG's lower crossing has the larger entry_k: it is
  // always in an earlier level than its higher one.
  for (int level = 0; level < kMaxLevels && !ev.empty(); ++level) {
    int64_t kmax = ev[0].k;
    for (const Event& e : ev) kmax = e.k > kmax ? e.k : kmax;
    size_t keep = 0;
    bool skipped = false;
    for (const Event& e : ev) {
      if (e.k != kmax) {
        ev[keep++] = e;
        continue;
      }
      if (!upgrade(e.j, e.p)) skipped = true;
    }
    if (skipped) break;  // the level that did not fit whole ends the walk
    ev.resize(keep);
  }
  return applied;
}

}  // namespace

double dynamiq_scale_of_u(double u) {
  if (!(u == u)) throw Error("dynamiq allocator: u is NaN");
  u = std::min(std::max(u, u_of_k(kPatternInf)), u_of_k(0));
  const int64_t k = kPatternOne - int64_t(u * kTwo52);
  return scale_of_k(std::min(std::max(k, int64_t(0)), kPatternInf));
}

double dynamiq_u_of_scale(double scale) {
  if (!(scale >= 0.0)) throw Error("dynamiq allocator: scale must be >= 0");
  return u_of_k(k_of_scale(scale));
}

WidthSet dynamiq_width_set(uint32_t mask, const DynamiqFormat& fmt) {
  if (mask == 0) throw Error("dynamiq allocator: no allowed widths (widths mask is 0); allow some of 1, 2, 4, 8, 16");
  if (mask & ~kDynamiqWidthMaskAll)
    throw Error("dynamiq allocator: widths mask 0x" + [&] {
      char b[16];
      std::snprintf(b, sizeof b, "%x", mask);
      return std::string(b);
    }() + " allows a width outside {1, 2, 4, 8, 16}");
  if (fmt.S <= 0 || fmt.s <= 0 || fmt.S % fmt.s != 0)
    throw Error("dynamiq allocator: super-group size " + std::to_string(fmt.S) +
                " must be a positive multiple of the group size " + std::to_string(fmt.s));
  WidthSet ws;
  for (int w : kDynamiqWidths)
    if (mask & (1u << w)) ws.w[ws.count++] = w;
  for (int i = 0; i + 1 < ws.count; ++i)
    if (dynamiq_sg_bytes(ws.w[i + 1], fmt) <= dynamiq_sg_bytes(ws.w[i], fmt))
      throw Error("dynamiq allocator: with S=" + std::to_string(fmt.S) + ", s=" + std::to_string(fmt.s) +
                  " a width-" + std::to_string(ws.w[i + 1]) + " super-group is not larger on the wire than a width-" +
                  std::to_string(ws.w[i]) + " one; drop one of the two widths");
  return ws;
}

int64_t dynamiq_num_sg(int64_t numel, const DynamiqFormat& fmt) {
  if (numel < 0) throw Error("dynamiq allocator: numel must be >= 0");
  if (fmt.S <= 0) throw Error("dynamiq allocator: super-group size must be positive");
  return ceil_div<int64_t>(numel, fmt.S);
}

double dynamiq_min_feasible_bits(int64_t numel, uint32_t mask, const DynamiqFormat& fmt) {
  const WidthSet ws = dynamiq_width_set(mask, fmt);
  const int64_t n = dynamiq_num_sg(numel, fmt);
  return numel == 0 ? 0.0 : 8.0 * double(n * dynamiq_sg_bytes(ws.w[0], fmt)) / double(numel);
}

bool dynamiq_budget_feasible(int64_t numel, double bits, uint32_t mask, const DynamiqFormat& fmt) {
  const WidthSet ws = dynamiq_width_set(mask, fmt);
  const int64_t n = dynamiq_num_sg(numel, fmt);
  return n == 0 || dynamiq_fits_budget(n * dynamiq_sg_bytes(ws.w[0], fmt), bits, numel);
}

AllocResult dynamiq_allocate(const float* sumsq, int64_t numel, const AllocParams& params,
                             AllocState& state, uint8_t* widths_out, int64_t stride) {
  Problem pr;
  pr.ws = dynamiq_width_set(params.widths_mask, params.format);
  pr.num_sg = dynamiq_num_sg(numel, params.format);
  if (!(std::isfinite(params.bits) && params.bits > 0.0))
    throw Error("dynamiq allocator: bits per coordinate must be a finite positive number, got " +
                fmt_bits(params.bits));
  if (pr.num_sg > 0 && (sumsq == nullptr || widths_out == nullptr))
    throw Error("dynamiq allocator: null statistics or output pointer");
  if (stride < 1) throw Error("dynamiq allocator: statistics stride must be >= 1");
  const int nt = pr.ws.count - 1;
  for (int i = 0; i < pr.ws.count; ++i) pr.sg_bytes[i] = dynamiq_sg_bytes(pr.ws.w[i], params.format);
  for (int p = 0; p < nt; ++p) pr.factor[p] = dynamiq_threshold_factor(pr.ws.w[p], pr.ws.w[p + 1]);
  pr.bits = params.bits;
  pr.numel = numel;

  AllocResult res;
  res.num_sg = pr.num_sg;
  res.budget_bits = params.bits * double(numel);
  res.num_thresholds = nt;
  for (int p = 0; p < nt; ++p) res.width_lo[p] = pr.ws.w[p], res.width_hi[p] = pr.ws.w[p + 1];
  if (pr.num_sg == 0) return res;

  const int64_t min_bytes = pr.num_sg * pr.sg_bytes[0];
  if (!pr.fits(min_bytes)) {  // the test of dynamiq_budget_feasible
    const double need = 8.0 * double(min_bytes) / double(numel);
    throw Error("dynamiq allocator: budget of " + fmt_bits(params.bits) +
                " bits per coordinate is below the minimum feasible " + fmt_bits(need) +
                " bits for this bucket (" + std::to_string(numel) + " elements, every super-group at " +
                std::to_string(pr.ws.w[0]) + " bits with its scales); raise bits to at least " +
                fmt_bits(need) + " or allow a narrower width");
  }

  std::vector<float> f(size_t(pr.num_sg));
  sanitize(sumsq, pr.num_sg, stride, f.data());

  int64_t k_final;      // pattern of the chosen C
  int64_t k_prev = -1;  // a smaller C known to be over budget, for fill_margin (-1: none)
  bool closed = true;   // k_prev is the next pattern below k_final's margin (false: an open bracket)
  int passes = 0;
  // The fast solver's exact step (the first, or one the carried u cannot
  // reach): the exact C rounded up to the grid u lives on (never more bits).
  auto exact_on_grid = [&] {
    const int64_t k_exact = exact_search(f, pr, passes);
    res.exact_search = true;
    k_final = std::min(kPatternInf, (k_exact + kGrid - 1) & ~(kGrid - 1));
    k_prev = k_exact - 1;
    state.has_u = true;
    state.u = u_of_k(k_final);
    state.step = double(kStepMin) / kTwo52;
  };
  const int64_t max_bytes = pr.num_sg * pr.sg_bytes[nt];
  if (pr.fits(max_bytes)) {
    k_final = 0;  // C = 0: every threshold 0, everything at the widest width
  } else if (params.solver == AllocSolver::kExact) {
    k_final = exact_search(f, pr, passes);
    res.exact_search = true;
    k_prev = k_final - 1;
  } else if (!(state.has_u && std::isfinite(state.u))) {
    // Fast solver, first step: there is no u to start from.
    exact_on_grid();
  } else {
    // Fast rule: bracket the carried u, then bisect, within a pass budget.
    auto fits_at = [&](int64_t k) {
      const Rule r = pr.rule(k);
      int64_t above[4] = {0, 0, 0, 0};
      count_pass(f.data(), pr.num_sg, r, above);
      ++passes;
      return pr.fits(pr.bytes(above));
    };
    const int limit = std::max(2, params.max_passes);
    int64_t k0 = k_of_scale(dynamiq_scale_of_u(state.u));
    const double st = std::isfinite(state.step) && state.step > 0 ? state.step * kTwo52 : 0.0;
    int64_t d = st >= double(kStepMax) ? kStepMax : std::max(kStepMin, int64_t(st));
    k0 = std::min(std::max(grid_down(k0), kGrid), kPatternInf - kGrid);
    d = grid_down(d);
    // Invariant: a does not fit, b fits. The ends are known without a pass.
    int64_t a = 0, b = kPatternInf;
    bool a_probed = false, b_probed = false;
    if (fits_at(k0)) {
      b = k0, b_probed = true;  // room: try more bits (smaller C), widening the step
      while (passes < limit) {
        const int64_t k = b - d;
        if (k <= a) break;
        if (fits_at(k)) b = k, d = std::min(kStepMax, d * 4);
        else { a = k, a_probed = true; break; }
      }
    } else {
      a = k0, a_probed = true;  // over budget: fewer bits (larger C), widening the step
      while (passes < limit) {
        const int64_t k = a + d;
        if (k >= b) break;
        if (fits_at(k)) { b = k, b_probed = true; break; }
        a = k, d = std::min(kStepMax, d * 4);
      }
    }
    while (passes < limit && b - a > kGrid) {
      const int64_t mid = a + grid_down((b - a) / 2);
      if (mid <= a || mid >= b) break;
      if (fits_at(mid)) b = mid, b_probed = true;
      else a = mid, a_probed = true;
    }
    state.has_u = true;
    if (!(a_probed && b_probed) || b - a > kFallbackWidth) {
      // The widening search did not reach the other side within the pass
      // budget, or reached it with no passes left to narrow the bracket: the
      // statistics moved further than max_passes can follow (from a converged
      // step, more than about 5 % in C). Without this the step would take the
      // last point that fits, which when nothing that fits was probed is every
      // SG at the narrowest width (a 10 % rise of the gradients' sum of
      // squares gave 2.56 bits of a 5-bit budget), and otherwise a C up to 4x
      // the widening's last step too large (2.4 bits under the exact solver
      // after a jump of 1e6). Search exactly instead, as on the first step.
      exact_on_grid();
      // the next step's first probe as far out as this step moved (the
      // statistics that moved this far are likely to move as far again)
      const int64_t moved = k_final > k0 ? k_final - k0 : k0 - k_final;
      state.step = double(std::min(kStepMax, std::max(kStepMin, grid_down(moved)))) / kTwo52;
      res.exact_fallback = true;
    } else {
      k_final = b;
      k_prev = a;  // C at a is over budget
      closed = b - a <= kGrid;
      // Next step starts at the best point that fits with the bracket width
      // as its first step.
      state.u = u_of_k(b);
      state.step = double(b - a) / kTwo52;
    }
  }

  const Rule r = pr.rule(k_final);
  assign_pass(f.data(), pr.num_sg, r, pr.ws, widths_out);
  // SGs per width from the counts at or above each threshold (one vectorised pass).
  int64_t above[5] = {pr.num_sg, 0, 0, 0, 0};
  count_pass(f.data(), pr.num_sg, r, above + 1);
  int64_t count[5] = {0, 0, 0, 0, 0};  // per position in ws
  for (int i = 0; i < pr.ws.count; ++i) count[i] = above[i] - (i + 1 < pr.ws.count ? above[i + 1] : 0);
  int64_t bytes = 0;
  for (int i = 0; i < pr.ws.count; ++i) bytes += count[i] * pr.sg_bytes[i];
  if (k_prev >= 0)
    res.tie_promoted =
        fill_margin(f.data(), pr, r, above + 1, pr.rule(k_prev), closed, widths_out, count, bytes, res.fill_passes);
  for (int i = 0; i < pr.ws.count; ++i) res.width_count[dynamiq_width_index(pr.ws.w[i])] = count[i];
  if (!pr.fits(bytes))  // cannot happen: every accepted k and promotion was checked
    throw Error("dynamiq allocator: internal error, allocation exceeds the budget");
  res.wire_bytes = bytes;
  res.bits_per_coord = 8.0 * double(bytes) / double(numel);
  for (int p = 0; p < nt; ++p) res.threshold[p] = r.t[p];
  res.scale = scale_of_k(k_final);
  res.u = u_of_k(k_final);
  res.passes = passes;
  return res;
}

}  // namespace dynamiq
