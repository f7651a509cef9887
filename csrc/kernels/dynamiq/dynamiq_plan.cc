// Plan helpers of the DynamiQ codec: wire offsets from the widths, a plan for
// tests and benchmarks, and the rounding context of a call. (The hook's plans
// come from the scheme, dynamiq_scheme.cc, which runs the allocator.)
#include <string>
#include <utility>

#include "kernels/dynamiq/dynamiq_codec.h"

namespace dynamiq {

void dynamiq_fill_wire_offsets(Plan& plan, const DynamiqFormat& fmt) {
  DQ_CHECK(plan.bits.size() == size_t(plan.num_units), "dynamiq plan: bits has the wrong size");
  DQ_CHECK(plan.order.empty() || plan.order.size() == size_t(plan.num_units),
           "dynamiq plan: order has the wrong size");
  plan.wire_offset.assign(size_t(plan.num_units) + 1, 0);
  for (int64_t w = 0; w < plan.num_units; ++w) {
    const int64_t src = plan.src_unit(w);
    DQ_CHECK(src >= 0 && src < plan.num_units, "dynamiq plan: order entry out of range");
    const int b = plan.bits[size_t(src)];
    DQ_CHECK(dynamiq_width_index(b) >= 0, "dynamiq plan: width " + std::to_string(b) +
                                              " is not one of 1, 2, 4, 8, 16");
    plan.wire_offset[size_t(w) + 1] = plan.wire_offset[size_t(w)] + dynamiq_sg_bytes(b, fmt);
  }
}

Plan make_dynamiq_plan(DType dtype, int64_t numel, const DynamiqFormat& fmt,
                       std::vector<uint8_t> bits, std::vector<int32_t> order,
                       std::vector<float> bias, int num_chunks) {
  DQ_CHECK(num_chunks >= 1, "dynamiq plan: num_chunks must be >= 1");
  Plan p;
  p.dtype = dtype;
  p.numel = numel;
  p.unit = fmt.S;
  p.num_units = ceil_div<int64_t>(numel, fmt.S);
  p.bits = std::move(bits);
  p.order = std::move(order);
  p.bias = std::move(bias);
  DQ_CHECK(p.bias.empty() || p.bias.size() == size_t(p.num_units), "dynamiq plan: bias has the wrong size");
  dynamiq_fill_wire_offsets(p, fmt);
  p.chunk_begin.resize(size_t(num_chunks) + 1);
  for (int c = 0; c <= num_chunks; ++c) p.chunk_begin[size_t(c)] = p.num_units * c / num_chunks;
  return p;
}

DqRounding make_dynamiq_rounding(const RngCtx& rng) {
  DQ_CHECK(rng.world >= 1 && rng.rank >= 0 && rng.rank < rng.world,
           "dynamiq: rank " + std::to_string(rng.rank) + " out of range for world " +
               std::to_string(rng.world));
  PermParams perm;
  const bool corr = rng.correlated && rng.stochastic && rng.world > 1;
  // gamma keeps 24 - ceil(log2 n) bits: at least 8 for n <= 2^16
  DQ_CHECK(!corr || rng.world <= (1 << 16),
           "dynamiq: correlated rounding supports at most 65536 ranks (got " +
               std::to_string(rng.world) + "); use rounding=\"independent\"");
  if (corr) perm = make_perm_params(rng.world, rng.rank);
  return make_rounding(rng.key, rng.rank, rng.world, rng.correlated, rng.stochastic, perm);
}

}  // namespace dynamiq
