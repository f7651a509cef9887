// DynamiqTables: the levels of each width, their decode tables and bracket
// search cells, and r/255, in one byte image (copied as is to a GPU), plus the
// CPU kernels' record layouts of the same numbers.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/dynamiq/dynamiq_codec.h"

namespace dynamiq {

std::vector<double> DynamiqTables::levels(int width, float eps, bool uniform) {
  DQ_CHECK(width == 2 || width == 4 || width == 8, "dynamiq levels: width must be 2, 4 or 8");
  const int m = (1 << (width - 1)) - 1;
  std::vector<double> L(size_t(m) + 1);
  const double lc = std::log1p(2.0 * double(eps) * double(eps));  // log(1 + 2 eps^2)
  for (int r = 0; r <= m; ++r) {
    if (uniform || eps == 0.0f)
      L[size_t(r)] = double(r) / double(m);
    else
      L[size_t(r)] = std::expm1(double(r) * lc) / std::expm1(double(m) * lc);
  }
  L[size_t(m)] = 1.0;
  return L;
}

namespace {

constexpr int kWidths[4] = {1, 2, 4, 8};

void validate_params(const DynamiqParams& p) {
  const DynamiqFormat& f = p.fmt;
  DQ_CHECK(f.s >= 1 && f.S >= 8 && f.S <= (1 << 16),
           "dynamiq: super-group size S must be in [8, 65536] and group size s >= 1");
  DQ_CHECK(f.S % 8 == 0, "dynamiq: super-group size S must be a multiple of 8 (got " +
                             std::to_string(f.S) + ")");
  DQ_CHECK(f.S % f.s == 0, "dynamiq: super-group size S (" + std::to_string(f.S) +
                               ") must be a multiple of the group size s (" +
                               std::to_string(f.s) + ")");
  for (float e : p.eps)
    DQ_CHECK(std::isfinite(e) && e >= 0.0f && e <= 4.0f,
             "dynamiq: eps must be finite and in [0, 4] (got " + std::to_string(e) + ")");
}

template <typename T>
size_t push_array(std::vector<uint8_t>& img, const std::vector<T>& v) {
  while (img.size() % 16) img.push_back(0);
  const size_t off = img.size();
  img.resize(off + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(img.data() + off, v.data(), v.size() * sizeof(T));
  return off;
}

template <typename T>
const T* at(const uint8_t* base, const T* off) {
  return reinterpret_cast<const T*>(base + reinterpret_cast<uintptr_t>(off));
}
template <typename T>
const T* as_off(size_t off) {
  return reinterpret_cast<const T*>(uintptr_t(off));
}

// One width's arrays before they go into the image.
struct WidthArrays {
  std::vector<float> level, invgap, decode;
  std::vector<int32_t> cell;
};

// The bracket search cells of levels Lf (m + 1 of them, m >= 1) into lv and
// cell. Below 2^E <= level[1] the bracket is 0; above, cells of 2^-mb relative
// width; pick the coarsest mb with at most one level per cell.
void build_cells(const std::vector<float>& Lf, DqLevels& lv, std::vector<int32_t>& cell) {
  const int m = lv.m;
  int e = 0;
  while (std::ldexp(1.0, e - 1) >= double(Lf[1])) --e;  // 2^(e-1) < level[1] ... 2^e
  while (std::ldexp(1.0, e) > double(Lf[1])) --e;       // largest 2^e <= level[1]
  const uint32_t base = f32_bits(float(std::ldexp(1.0, e)));
  const uint32_t one = f32_bits(1.0f);
  int chosen_mb = -1, chosen_fix = 0;
  for (int mb = 3; mb <= 16; ++mb) {
    const int shift = 23 - mb;
    const uint32_t nc = ((one - base) >> shift) + 1;
    if (nc > (1u << 17)) break;
    int fix = 0;
    size_t j = 1;  // next level to place
    for (uint32_t c = 0; c < nc; ++c) {
      const float lo = bits_f32(base + (c << shift));
      const float hi = bits_f32(base + (c << shift) + ((1u << shift) - 1u));
      while (j < size_t(m) && Lf[j] <= lo) ++j;
      int cnt = 0;
      for (size_t k = j; k < size_t(m) && Lf[k] <= hi; ++k) ++cnt;
      fix = std::max(fix, cnt);
    }
    chosen_mb = mb;
    chosen_fix = fix;
    if (fix <= 1) break;
  }
  DQ_CHECK(chosen_mb > 0, "dynamiq: cannot build the level search table");
  lv.cell_shift = 23 - chosen_mb;
  lv.cell_base = base;
  lv.ncells = int32_t(((one - base) >> lv.cell_shift) + 1);
  DQ_CHECK(chosen_fix <= 1, "dynamiq: levels too dense for the bracket search table");
  cell.resize(size_t(lv.ncells));
  for (int32_t c = 0; c < lv.ncells; ++c) {
    const float lo = bits_f32(base + (uint32_t(c) << lv.cell_shift));
    int j = 0;
    while (j + 1 < m && Lf[size_t(j) + 1] <= lo) ++j;
    cell[size_t(c)] = j;
  }
}

// Width b's arrays (levels with eps), and lv's sizes and search parameters.
WidthArrays build_width(int b, float eps, bool uniform, DqLevels& lv) {
  WidthArrays a;
  lv.width = b;
  if (b == 1) {
    lv.m = 0;
    a.level = {0.0f};
    a.decode = {-1.0f, 1.0f};
    return a;
  }
  const int m = (1 << (b - 1)) - 1;
  lv.m = m;
  std::vector<float>& Lf = a.level;
  for (double v : DynamiqTables::levels(b, eps, uniform)) Lf.push_back(float(v));
  for (int j = 0; j < m; ++j)
    DQ_CHECK(Lf[size_t(j) + 1] > Lf[size_t(j)],
             "dynamiq: eps=" + std::to_string(eps) + " for width " + std::to_string(b) +
                 " gives levels that collapse in float32; use a smaller eps");
  for (int j = 0; j < m; ++j)
    a.invgap.push_back(float(1.0 / (double(Lf[size_t(j) + 1]) - double(Lf[size_t(j)]))));
  for (int c = 0; c < (1 << b); ++c) {
    const int idx = c & m;
    a.decode.push_back((c >> (b - 1)) ? -Lf[size_t(idx)] : Lf[size_t(idx)]);
  }
  build_cells(Lf, lv, a.cell);  // used by width 8; built for every width >= 2
  return a;
}

// DynamiqTables::cell_rec of one width (lv rebased).
std::vector<uint32_t> make_cell_rec(const DqLevels& lv) {
  std::vector<uint32_t> rec;
  for (int32_t c = 0; c < lv.ncells; ++c) {
    const int32_t j = lv.cell[c];
    const bool last = j == lv.m - 1;
    rec.push_back(last ? 0x7f800000u : f32_bits(lv.level[j + 1]));
    rec.push_back(f32_bits(lv.level[j]));
    rec.push_back(f32_bits(lv.invgap[j]));
    rec.push_back(last ? 0u : f32_bits(lv.invgap[j + 1]));
  }
  return rec;
}

}  // namespace

DynamiqTables::DynamiqTables(const DynamiqParams& p) {
  validate_params(p);
  for (int wi = 0; wi < 4; ++wi) {
    DqLevels& lv = offsets_.lv[wi];
    const WidthArrays a = build_width(kWidths[wi], p.eps[size_t(wi)], p.uniform_levels, lv);
    lv.level = as_off<float>(push_array(image_, a.level));
    lv.invgap = as_off<float>(push_array(image_, a.invgap));
    lv.decode = as_off<float>(push_array(image_, a.decode));
    lv.cell = as_off<int32_t>(push_array(image_, a.cell));
  }
  std::vector<float> r255(256);
  for (int r = 0; r < 256; ++r) r255[size_t(r)] = float(double(r) / 255.0);
  offsets_.r255 = as_off<float>(push_array(image_, r255));
  view_ = rebased(image_.data());
  // the CPU kernels' records
  for (int r = 0; r < 256; ++r) {
    r255_rec_.push_back(r255[size_t(std::max(r - 1, 0))]);
    r255_rec_.push_back(r255[size_t(r)]);
    r255_rec_.push_back(r255[size_t(std::min(r + 1, 255))]);
    r255_rec_.push_back(0.0f);
  }
  for (int wi = 1; wi < 4; ++wi) cell_rec_[wi] = make_cell_rec(view_.lv[wi]);
}

DqTables DynamiqTables::rebased(const uint8_t* base) const {
  DqTables t = offsets_;
  for (auto& lv : t.lv) {
    lv.level = at(base, lv.level);
    lv.invgap = at(base, lv.invgap);
    lv.decode = at(base, lv.decode);
    lv.cell = at(base, lv.cell);
  }
  t.r255 = at(base, t.r255);
  return t;
}

}  // namespace dynamiq
