// The DynamiQ codec (paper section 3.3): super-groups of S values, each with
// its own width b in {1, 2, 4, 8, 16} chosen by the allocator, groups of s
// values with uint8 scales under a bf16 super-group scale, non-uniform
// levels, stochastic rounding that is unbiased, correlated across ranks.
// The math is in dynamiq_math.h; the CPU codec is dynamiq_codec.cc (per
// super-group stages and their dispatch) over the kernels of
// dynamiq_cpu_{scalar,avx2}.cc (dynamiq_cpu.h), all bit-identical to the
// shared functions; tables in dynamiq_tables.cc, plan helpers in
// dynamiq_plan.cc.
//
// WIRE FORMAT of a block [w0, w1) of wire positions: the super-groups in wire
// order, back to back, no header and no padding; the layout of one SG (scales,
// planar codes, widths 1-16, non-finite SGs) is specified once, in README.md
// ("Wire layout"), and pinned by tests/golden/wire.txt. Every bit pattern of
// the right size is a valid message, so decoders check only the size
// (check_message_size).
//
// RANDOMNESS (philox.h, key = RngCtx.key from (seed, collective sequence)):
// the layout (which Philox call and which bits round each element, make its
// shared permutation and round each stochastic group scale) is defined in
// README.md ("Randomness"), its per-element reference in dynamiq_math.h
// (dq_value_word, dq_word32, dq_group_word). A rank compresses each coordinate
// at most once per collective, so every draw is used once.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "kernels/codec.h"
#include "kernels/dynamiq/dynamiq_format.h"
#include "kernels/dynamiq/dynamiq_math.h"
#include "kernels/plan_key.h"

namespace dynamiq {

// Default eps per width (1, 2, 4, 8), chosen by experiments/dynamiq_eps.cc
// (experiments/results/dynamiq_eps/). Widths 1 and 2 have no interior levels.
constexpr std::array<float, 4> kDynamiqDefaultEps{{0.0f, 0.0f, 0.30f, 0.06f}};

struct DynamiqParams {
  DynamiqFormat fmt;
  std::array<float, 4> eps = kDynamiqDefaultEps;
  bool uniform_levels = false;          // ablation: eps -> 0 (levels r/m)
  bool stochastic_group_scales = false; // true: paper's stochastic uint8 scales; false: round up
};

// Host storage of the tables of a parameter set (levels, bracket search,
// decode, r/255). view() points into this object.
class DynamiqTables {
 public:
  explicit DynamiqTables(const DynamiqParams& p);
  // view_ points into image_: a copy must point into its own image (a moved
  // vector keeps its buffer, so moves need nothing).
  DynamiqTables(const DynamiqTables& o)
      : image_(o.image_), offsets_(o.offsets_), view_(rebased(image_.data())) {
    for (int wi = 0; wi < 4; ++wi) {
      cell_rec_[wi] = o.cell_rec_[wi];
    }
    r255_rec_ = o.r255_rec_;
  }
  DynamiqTables& operator=(const DynamiqTables& o) {
    if (this != &o) *this = DynamiqTables(o);
    return *this;
  }
  DynamiqTables(DynamiqTables&&) = default;
  DynamiqTables& operator=(DynamiqTables&&) = default;
  const DqTables& view() const { return view_; }
  // The levels of width b in double precision, as the formula gives them
  // (before rounding to float); for tests and experiments.
  static std::vector<double> levels(int width, float eps, bool uniform);
  // Contiguous byte image of all tables and the offsets of each array in it,
  // so a device copy can rebase the pointers (see cuda/dynamiq_kernels.h).
  const std::vector<uint8_t>& image() const { return image_; }
  // CPU-only: everything the bracket step needs per cell c, as 4 x 32 bits (one
  // 16-byte load; the AVX2 width-8 loop): with j = cell[c], (bits of level[j + 1]
  // or 0x7f800000 when j = m - 1 (no step past the last bracket), bits of
  // level[j], bits of invgap[j], bits of invgap[j + 1] or 0 when j = m - 1).
  const uint32_t* cell_rec(int wi) const { return cell_rec_[wi].data(); }
  // CPU-only: r255_rec[4 r .. 4 r + 3] = (r255[max(r - 1, 0)], r255[r],
  // r255[min(r + 1, 255)], 0), r < 256: the three values the round-up group
  // scale reads around its first guess r, in one 16-byte load (the AVX2
  // loop).
  const float* r255_rec() const { return r255_rec_.data(); }
  DqTables rebased(const uint8_t* base) const;

 private:
  std::vector<uint8_t> image_;
  DqTables offsets_;  // pointers hold byte offsets into image_
  DqTables view_;
  std::vector<uint32_t> cell_rec_[4];
  std::vector<float> r255_rec_;
};

class DynamiqCodec final : public Codec {
 public:
  explicit DynamiqCodec(const DynamiqParams& p = DynamiqParams());
  std::string name() const override { return "dynamiq"; }
  const DynamiqParams& params() const { return p_; }
  const DynamiqTables& tables() const { return tables_; }

  size_t static_bytes(const Plan& plan, const Block& b) const override;
  size_t compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                  uint8_t* out) const override;
  void decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                  const Output& y) const override;
  void decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                             const Block& b, float* acc) const override;
  size_t decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, const RngCtx& rng,
                                          uint8_t* out) const override;
  // One pass: each SG decoded onto the local values in a tile and stored.
  void decompress_accumulate_output(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                                    const Block& b, const Output& y) const override;

 private:
  // Checks the whole plan against the format, once per plan (its PlanKey):
  // unit, sizes, and per wire position the source unit, its width and bytes.
  void check_plan(const Plan& plan) const;
  // check_plan, then block b against the plan's size (O(1) once the plan is
  // checked); returns the block's bytes.
  size_t check_block(const Plan& plan, const Block& b) const;
  DynamiqParams p_;
  DynamiqTables tables_;
  SeenPlans<4> checked_;  // the plans check_plan passed
};

// The rounding context of a compression call (builds the permutation table
// column when the world needs one).
DqRounding make_dynamiq_rounding(const RngCtx& rng);

// (The CPU kernels are the build's: AVX2 in the x86-64-v3 build, the portable
// ones otherwise; the process-wide switch of kernels/base/cpu_isa.h does not
// change them, there being no AVX-512 DynamiQ kernels.)

// The CPU kernels' random words of one SG (SIMD Philox where it applies):
// words[4k + j] = word j of Philox call call0 + k, k < S/4. For tests.
void dynamiq_fill_words(const RngKey& key, uint64_t call0, uint32_t purpose, uint32_t who, int S,
                        uint32_t* words);

// Fills plan.wire_offset from plan.bits and plan.order (wire order).
void dynamiq_fill_wire_offsets(Plan& plan, const DynamiqFormat& fmt);

// A plan for tests and benchmarks: S-element units, the given width per
// source SG, `order` (empty: identity), bias (empty: none), `num_chunks`
// chunks of nearly equal unit count, wire offsets filled.
Plan make_dynamiq_plan(DType dtype, int64_t numel, const DynamiqFormat& fmt,
                       std::vector<uint8_t> bits, std::vector<int32_t> order,
                       std::vector<float> bias, int num_chunks);

}  // namespace dynamiq
