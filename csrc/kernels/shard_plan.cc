// Plans for reduce-scatter and all-gather: chunk c is exactly shard c
// (scheme.h, Scheme::make_shard_plan).
#include <string>

#include "kernels/scheme.h"

namespace dynamiq {

int64_t identity_shard_unit(int64_t shard) {
  if (shard <= 0) return 256;
  for (int64_t u = 256; u >= 64; --u)
    if (shard % u == 0) return u;
  return shard <= 4096 ? shard : 0;
}

Plan Scheme::make_shard_plan(DType dtype, int64_t numel, int shards, int world, const float* global_stats,
                             PlanState& state, PlanInfo& info) const {
  DQ_CHECK(shards >= 1 && numel % shards == 0, "shard plan: the bucket does not split into equal shards");
  Plan p = make_plan(dtype, numel, shards, world, global_stats, state, info);
  const int64_t m = numel / shards;
  bool ok = p.order.empty() && p.num_chunks() == shards && m % p.unit == 0;
  for (int c = 0; ok && c <= shards; ++c) ok = p.chunk_begin[size_t(c)] == int64_t(c) * (m / p.unit);
  DQ_CHECK(ok, "shard plan: the plan's chunks are not the " + std::to_string(shards) + " shards of " +
                   std::to_string(m) + " elements (unit " + std::to_string(p.unit) +
                   "); shards must be padded to a multiple of the mode's unit (dynamiq.padded_shard)");
  return p;
}

}  // namespace dynamiq
