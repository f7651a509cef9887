// The documented order inside a DynamiQ chunk (csrc/alloc/dynamiq_layout.h): one run per width,
// widest first, source order inside a run (issue 35, item 5: a mutation that dealt the widths
// narrowest first survived the suite, which checked one run per width but not their order).
// Checked on the layout alone for every mix of the five widths, and on plans the scheme makes,
// flat scales included (wire size, not the width's number, is what the dealing sorts by; the
// two orders agree because a wider super-group always costs more bytes, which
// dynamiq_width_set enforces).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "alloc/dynamiq_layout.h"
#include "hook/collective/config.h"
#include "kernels/dynamiq/dynamiq_stats.h"
#include "kernels/scheme.h"
#include "params_util.h"

namespace dynamiq {
namespace {

// Within every chunk: widths non-increasing along the wire, source order within a width.
void expect_widest_first(const Plan& p, const std::string& what) {
  for (int c = 0; c < p.num_chunks(); ++c)
    for (int64_t w = p.chunk_begin[size_t(c)] + 1; w < p.chunk_begin[size_t(c) + 1]; ++w) {
      const int64_t a = p.src_unit(w - 1), b = p.src_unit(w);
      const int wa = p.bits[size_t(a)], wb = p.bits[size_t(b)];
      ASSERT_GE(wa, wb) << what << ": chunk " << c << " wire " << w << ": width " << wb << " after " << wa;
      if (wa == wb) {
        ASSERT_LT(a, b) << what << ": chunk " << c << " wire " << w << ": source order";
      }
    }
}

TEST(LayoutOrder, RunsInsideEveryChunkAreWidestFirst) {
  static const uint8_t kW[5] = {1, 2, 4, 8, 16};
  std::mt19937 g(11);
  int checked = 0;
  for (int mask = 1; mask < 32; ++mask) {  // every non-empty subset of widths present
    std::vector<uint8_t> present;
    for (int i = 0; i < 5; ++i)
      if (mask >> i & 1) present.push_back(kW[i]);
    for (int64_t num : {int64_t(1), int64_t(5), int64_t(37), int64_t(300)})
      for (int n : {1, 2, 3, 7, 16}) {
        std::uniform_int_distribution<size_t> pick(0, present.size() - 1);
        Plan p;
        p.numel = num * 256 - (num > 1 ? 100 : 0);
        p.bits.resize(size_t(num));
        for (auto& b : p.bits) b = present[pick(g)];
        for (bool hierarchical : {true, false}) {
          DynamiqFormat fmt;
          fmt.hierarchical = hierarchical;
          dynamiq_layout(p, fmt, n);
          expect_widest_first(p, "mask " + std::to_string(mask) + " num " + std::to_string(num) + " n " +
                                     std::to_string(n) + (hierarchical ? "" : " flat"));
          ++checked;
        }
      }
  }
  EXPECT_EQ(checked, 31 * 4 * 5 * 2);
}

TEST(LayoutOrder, SchemePlansAreWidestFirst) {
  // Buckets whose super-groups span many magnitudes, so the allocator gives several widths.
  std::mt19937 g(5);
  std::normal_distribution<float> nd;
  const int64_t numel = 64 * 256 + 77;
  std::vector<float> x(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) x[size_t(i)] = nd(g) * std::ldexp(1.0f, int(i / 256 % 24) - 12);
  for (uint32_t widths : {kDynamiqWidthMaskDefault, kDynamiqWidthMaskAll})
    for (bool hierarchical : {true, false})
      for (int world : {2, 3, 8}) {
        CollectiveConfig cfg;
        cfg.mode = mode_id("dynamiq");
        cfg.params.set("widths", widths_of(widths));
        cfg.params.set("hierarchical_scales", double(hierarchical));
        cfg.params.set("bits", double(6.0));
        const auto scheme = make_scheme(cfg);
        std::vector<float> stats(size_t(scheme->stats_count(DType::kF32, numel)));
        ASSERT_FALSE(scheme->local_pass(x.data(), DType::kF32, numel, stats.data()));
        PlanState ps;
        PlanInfo info;
        const Plan p = scheme->make_plan(DType::kF32, numel, world, world, stats.data(), ps, info);
        int widths_used = 0;
        for (int i = 0; i < 5; ++i) widths_used += info.width_units[i] > 0;
        ASSERT_GE(widths_used, 2) << "the bucket should need several widths";
        expect_widest_first(p, "widths " + std::to_string(widths) + " world " + std::to_string(world) +
                                   (hierarchical ? "" : " flat"));
      }
}

}  // namespace
}  // namespace dynamiq
