#include "alloc/dynamiq_layout.h"

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

namespace dynamiq {

namespace {

// Width -> index into kDynamiqWidths (-1: not a width), for widths 0..16.
constexpr int8_t kIndexOfWidth[17] = {-1, 0, 1, -1, 2, -1, -1, -1, 3, -1, -1, -1, -1, -1, -1, -1, 4};

void natural_chunks(Plan& plan, int n) {
  const int64_t num = plan.num_units;
  const __int128 total = plan.wire_offset[size_t(num)];
  plan.chunk_begin.assign(size_t(n) + 1, 0);
  plan.chunk_begin[size_t(n)] = num;
  int64_t w = 0;
  for (int c = 1; c < n; ++c) {
    // Boundary c: the wire position whose byte prefix P is nearest to
    // c * total / n (ties to the lower one), compared exactly as n*P vs c*total.
    const __int128 target = total * c;
    while (w < num && __int128(plan.wire_offset[size_t(w)]) * n < target) ++w;
    if (w > 0) {
      const __int128 above = __int128(plan.wire_offset[size_t(w)]) * n - target;
      const __int128 below = target - __int128(plan.wire_offset[size_t(w - 1)]) * n;
      if (below <= above) --w;
    }
    w = std::max(w, plan.chunk_begin[size_t(c - 1)]);
    plan.chunk_begin[size_t(c)] = w;
  }
}

}  // namespace

void dynamiq_layout(Plan& plan, const DynamiqFormat& fmt, int n, SgLayout layout) {
  if (n < 1) throw Error("dynamiq layout: number of chunks must be >= 1, got " + std::to_string(n));
  const int64_t num = dynamiq_num_sg(plan.numel, fmt);
  if (fmt.s <= 0 || fmt.S % fmt.s != 0)
    throw Error("dynamiq layout: super-group size must be a positive multiple of the group size");
  if (int64_t(plan.bits.size()) != num)
    throw Error("dynamiq layout: plan.bits holds " + std::to_string(plan.bits.size()) +
                " widths for a bucket of " + std::to_string(num) + " super-groups");
  if (num > INT32_MAX) throw Error("dynamiq layout: more than 2^31-1 super-groups in one bucket");
  plan.unit = fmt.S;
  plan.num_units = num;

  // Validate and count per width: branch-free compares so the loop vectorises.
  int64_t count[5] = {0, 0, 0, 0, 0};
  {
    const uint8_t* w = plan.bits.data();
    int64_t c1 = 0, c2 = 0, c4 = 0, c8 = 0, c16 = 0;
    for (int64_t j = 0; j < num; ++j) {
      const uint8_t x = w[j];
      c1 += x == 1, c2 += x == 2, c4 += x == 4, c8 += x == 8, c16 += x == 16;
    }
    count[0] = c1, count[1] = c2, count[2] = c4, count[3] = c8, count[4] = c16;
    if (c1 + c2 + c4 + c8 + c16 != num) {
      int64_t bad = 0;
      while (w[bad] <= 16 && kIndexOfWidth[w[bad]] >= 0) ++bad;
      throw Error("dynamiq layout: super-group " + std::to_string(bad) + " has width " +
                  std::to_string(int(plan.bits[size_t(bad)])) + ", not one of 1, 2, 4, 8, 16");
    }
  }
  int64_t sg_bytes[5];
  for (int i = 0; i < 5; ++i) sg_bytes[i] = dynamiq_sg_bytes(kDynamiqWidths[i], fmt);

  if (layout == SgLayout::kNatural) {
    plan.order.clear();
    plan.wire_offset.resize(size_t(num) + 1);
    int64_t acc = 0;
    for (int64_t j = 0; j < num; ++j) {
      plan.wire_offset[size_t(j)] = acc;
      acc += sg_bytes[kIndexOfWidth[plan.bits[size_t(j)]]];
    }
    plan.wire_offset[size_t(num)] = acc;
    natural_chunks(plan, n);
    return;
  }

  if (layout == SgLayout::kShards) {
    if (num % n != 0)
      throw Error("dynamiq layout: " + std::to_string(num) + " super-groups do not split into " +
                  std::to_string(n) + " equal shards");
    const int64_t per = num / n;
    // widths in decreasing wire size (ties: wider first)
    int by_size[5] = {4, 3, 2, 1, 0};
    std::stable_sort(by_size, by_size + 5, [&](int x, int y) { return sg_bytes[x] > sg_bytes[y]; });
    int rank_of[5];
    for (int t = 0; t < 5; ++t) rank_of[by_size[t]] = t;
    plan.order.resize(size_t(num));
    plan.wire_offset.resize(size_t(num) + 1);
    plan.chunk_begin.assign(size_t(n) + 1, 0);
    int64_t acc = 0;
    for (int64_t c = 0; c < n; ++c) {
      const int64_t b = c * per, e = b + per;
      int64_t cnt[5] = {0, 0, 0, 0, 0};
      for (int64_t j = b; j < e; ++j) ++cnt[rank_of[kIndexOfWidth[plan.bits[size_t(j)]]]];
      int64_t pos[5], off[5];
      pos[0] = b;
      off[0] = acc;
      for (int t = 1; t < 5; ++t) {
        pos[t] = pos[t - 1] + cnt[t - 1];
        off[t] = off[t - 1] + cnt[t - 1] * sg_bytes[by_size[t - 1]];
      }
      for (int t = 0; t < 5; ++t) acc += cnt[t] * sg_bytes[by_size[t]];
      for (int64_t j = b; j < e; ++j) {
        const int t = rank_of[kIndexOfWidth[plan.bits[size_t(j)]]];
        plan.order[size_t(pos[t])] = int32_t(j);
        plan.wire_offset[size_t(pos[t]++)] = off[t];
        off[t] += sg_bytes[by_size[t]];
      }
      plan.chunk_begin[size_t(c) + 1] = e;
    }
    plan.wire_offset[size_t(num)] = acc;
    return;
  }

  int64_t start[6] = {0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 5; ++i) start[i + 1] = start[i] + count[i];
  std::vector<int32_t> by_width(static_cast<size_t>(num));
  {
    int64_t fill[5];
    std::copy(start, start + 5, fill);
    for (int64_t j = 0; j < num; ++j) by_width[size_t(fill[kIndexOfWidth[plan.bits[size_t(j)]]]++)] = int32_t(j);
  }

  // Widths present, in decreasing wire size (ties: wider first).
  int dealt[5];
  int nw = 0;
  for (int i = 4; i >= 0; --i)
    if (count[i] > 0) dealt[nw++] = i;
  std::stable_sort(dealt, dealt + nw, [&](int x, int y) { return sg_bytes[x] > sg_bytes[y]; });

  // Per width: q SGs to every chunk, r leftovers to chunks ptr, ptr+1, ... (mod n).
  int64_t q[5] = {0, 0, 0, 0, 0}, r[5] = {0, 0, 0, 0, 0}, ptr[5] = {0, 0, 0, 0, 0};
  int64_t p = 0;
  for (int t = 0; t < nw; ++t) {
    const int i = dealt[t];
    q[i] = count[i] / n;
    r[i] = count[i] % n;
    ptr[i] = p;
    p = (p + r[i]) % n;
  }
  auto gets_leftover = [&](int i, int64_t c) { return (c - ptr[i] + n) % n < r[i]; };

  plan.chunk_begin.assign(size_t(n) + 1, 0);
  for (int64_t c = 0; c < n; ++c) {
    int64_t sz = 0;
    for (int t = 0; t < nw; ++t) sz += q[dealt[t]] + (gets_leftover(dealt[t], c) ? 1 : 0);
    plan.chunk_begin[size_t(c) + 1] = plan.chunk_begin[size_t(c)] + sz;
  }
  // Write chunk by chunk, one run per width; wire offsets advance by the
  // run's SG size, so no per-SG lookup of the width.
  plan.order.resize(size_t(num));
  plan.wire_offset.resize(size_t(num) + 1);
  int32_t* order = plan.order.data();
  int64_t* off = plan.wire_offset.data();
  int64_t pos = 0, acc = 0;
  for (int64_t c = 0; c < n; ++c) {
    for (int t = 0; t < nw; ++t) {
      const int i = dealt[t];
      const int64_t sb = sg_bytes[i];
      // Base slice (source order), then this chunk's leftover, which comes
      // from the tail of the width's list and so keeps source order.
      const int32_t* base = by_width.data() + start[i] + c * q[i];
      for (int64_t k = 0; k < q[i]; ++k) {
        order[pos + k] = base[k];
        off[pos + k] = acc + k * sb;
      }
      pos += q[i];
      acc += q[i] * sb;
      if (gets_leftover(i, c)) {
        order[pos] = by_width[size_t(start[i] + n * q[i] + (c - ptr[i] + n) % n)];
        off[pos++] = acc;
        acc += sb;
      }
    }
  }
  off[num] = acc;
}

AllocResult fill_dynamiq_plan(Plan& plan, DType dtype, int64_t numel, const float* sumsq, int64_t stride,
                              const AllocParams& params, AllocState& state, int num_chunks, SgLayout layout) {
  if (num_chunks < 1) throw Error("dynamiq layout: number of chunks must be >= 1, got " + std::to_string(num_chunks));
  plan.dtype = dtype;
  plan.numel = numel;
  plan.bias.clear();
  plan.bits.resize(size_t(dynamiq_num_sg(numel, params.format)));
  const AllocResult r = dynamiq_allocate(sumsq, numel, params, state, plan.bits.data(), stride);
  dynamiq_layout(plan, params.format, num_chunks, layout);
  return r;
}

Plan make_dynamiq_plan(DType dtype, int64_t numel, const float* sumsq, int64_t stride,
                       const AllocParams& params, AllocState& state, int num_chunks, SgLayout layout,
                       AllocResult* result) {
  Plan plan;
  const AllocResult r = fill_dynamiq_plan(plan, dtype, numel, sumsq, stride, params, state, num_chunks, layout);
  if (result) *result = r;
  return plan;
}

}  // namespace dynamiq
