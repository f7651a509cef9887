// libFuzzer target: the DynamiQ plan from received statistics. The per-super-group
// (mean, sum of squares) pairs reach every rank through the metadata all-reduce (raw
// float32 from its peers: any bit pattern, NaN and inf included), and the allocator state
// (PlanState: u and step) can come from a restored checkpoint; the scheme's make_plan turns
// them into widths, order, chunks and bias.
//
// Input: a 32-byte prefix, then the statistics (float32 little-endian, 2 per super-group;
// missing ones read as 0).
//   p[0..7]  the DynamiQ parameters (fuzz_codec.h config_of)
//   p[8..9]  numel = 1 + u16 % 20000
//   p[10]    world = 1 + p[10] % 16; p[11] topology (topology_of): chunks = topology_chunks
//   p[12]    bit 0: a carried allocator state (u = p[16..23], step = p[24..31] as doubles)
//
// Properties on the plan returned (make_plan may not throw: every float is a legal
// statistic, dynamiq_sanitize_stat): num_units = ceil(numel / S); order is a permutation;
// every width is an allowed one; wire_offset are the exact SG sizes in wire order; the wire
// bytes fit the budget (8 * bytes <= bits * numel); chunk_begin runs from 0 to num_units,
// non-decreasing; inside each chunk the super-groups run widest first, one run per width, in
// source order (dynamiq_layout.h); bias has one entry per super-group; a carried u that the
// allocator rewrites is finite and in [-1024, 1023]; the block table and every rank's program can be made.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/registry.h"
#include "alloc/dynamiq_alloc.h"
#include "fuzz_codec.h"

using namespace dqfuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input<32> in(data, size);
  CodecCase c;
  c.mode = mode_id("dynamiq");
  std::memcpy(c.mode_params, in.p, 8);
  CollectiveConfig cfg = config_of(c);
  const std::shared_ptr<const Scheme> scheme = cached_scheme(cfg);
  if (!scheme) return 0;
  const int64_t numel = 1 + in.u16(8) % 20000;
  if (!scheme->fits_budget(numel)) return 0;
  const int world = 1 + in.p[10] % 16;
  const Topology topo = topology_of(in.p[11]);
  const int chunks = topology_chunks(topo, world);
  PlanState ps;
  if (in.p[12] & 1) {
    ps.has_u = true;
    uint64_t u = in.u64(16), st = in.u64(24);
    std::memcpy(&ps.u, &u, 8);
    std::memcpy(&ps.step, &st, 8);
  }
  const int64_t count = scheme->stats_count(DType::kF32, numel);
  std::vector<float> stats(size_t(count), 0.0f);
  std::memcpy(stats.data(), in.rest, std::min(in.rest_bytes, stats.size() * sizeof(float)));
  const double u_in = ps.u;
  PlanInfo info;
  Plan plan;
  try {
    plan = scheme->make_plan(DType::kF32, numel, chunks, world, stats.data(), ps, info);
  } catch (const std::exception& e) {
    fail(std::string("make_plan threw on received statistics: ") + e.what());
  }
  const ParamSet prm = resolve_params(mode_params(cfg.mode), cfg.params, "dynamiq");
  uint32_t widths_mask = 0;
  for (double w : prm.list("widths")) widths_mask |= 1u << int(w);
  const int S = int(prm.num("supergroup_size"));
  const int64_t nsg = (numel + S - 1) / S;
  FUZZ_CHECK(plan.numel == numel && plan.unit == S && plan.num_units == nsg, "plan shape");
  FUZZ_CHECK(plan.order.size() == size_t(nsg) && plan.bits.size() == size_t(nsg) &&
                 plan.bias.size() == size_t(nsg) && plan.wire_offset.size() == size_t(nsg) + 1,
             "plan vector sizes");
  std::vector<uint8_t> seen(size_t(nsg), 0);
  DynamiqFormat fmt;
  fmt.S = S;
  fmt.s = int(prm.num_or("group_size", 16));
  fmt.hierarchical = prm.flag("hierarchical_scales");
  FUZZ_CHECK(plan.wire_offset[0] == 0, "wire_offset[0]");
  for (int64_t w = 0; w < nsg; ++w) {
    const int32_t src = plan.order[size_t(w)];
    FUZZ_CHECK(src >= 0 && src < nsg && !seen[size_t(src)], "order is not a permutation");
    seen[size_t(src)] = 1;
    const int b = plan.bits[size_t(src)];
    FUZZ_CHECK(dynamiq_width_index(b) >= 0 && ((widths_mask >> b) & 1), "width " + std::to_string(b));
    FUZZ_CHECK(plan.wire_offset[size_t(w) + 1] - plan.wire_offset[size_t(w)] == dynamiq_sg_bytes(b, fmt),
               "wire_offset is not the SG size");
  }
  FUZZ_CHECK(dynamiq_fits_budget(plan.wire_offset.back(), prm.num("bits"), numel),
             "over budget: " + std::to_string(plan.wire_offset.back()) + " bytes for bits=" +
                 std::to_string(prm.num("bits")) + " numel=" + std::to_string(numel));
  FUZZ_CHECK(plan.num_chunks() == chunks && plan.chunk_begin.front() == 0 && plan.chunk_begin.back() == nsg,
             "chunk_begin ends");
  for (int ch = 0; ch < chunks; ++ch) {
    const int64_t a = plan.chunk_begin[size_t(ch)], e = plan.chunk_begin[size_t(ch) + 1];
    FUZZ_CHECK(a <= e, "chunk_begin decreases");
    for (int64_t w = a + 1; w < e; ++w) {
      const int32_t s0 = plan.order[size_t(w) - 1], s1 = plan.order[size_t(w)];
      const int b0 = plan.bits[size_t(s0)], b1 = plan.bits[size_t(s1)];
      FUZZ_CHECK(b0 > b1 || (b0 == b1 && s0 < s1), "chunk " + std::to_string(ch) +
                                                        ": not widest first in source order at wire " +
                                                        std::to_string(w));
    }
  }
  // The allocator leaves the state alone where it searches nothing (every SG fits at the
  // widest width) or ignores it (exact solver); a state it writes is a valid one.
  if (ps.has_u && std::memcmp(&ps.u, &u_in, 8) != 0)
    FUZZ_CHECK(std::isfinite(ps.u) && ps.u >= -1024.0 && ps.u <= 1023.0, "carried u " + std::to_string(ps.u));
  const BlockTable bt = make_blocks(plan, cfg.compressed_block_bytes());
  for (int r = 0; r < world; ++r) (void)make_program(topo, r, world, bt);
  return 0;
}
