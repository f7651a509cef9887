// Wire layout of a DynamiQ bucket: the order in which super-groups (SGs)
// travel and where the wire order is cut into one chunk per owner rank.
//
// kBalancedByWidth (the default): every chunk gets floor(count_w / n) SGs of
// each width w, as one contiguous slice of that width's SGs in source order;
// the count_w mod n leftovers of all widths are then dealt round-robin in
// decreasing byte size, one pointer running across widths. Inside a chunk the
// SGs are grouped by width, widest first, one run per width, in source order.
// Guarantees (n chunks, B = bytes of the largest SG present):
//  - wire bytes:   max_c bytes(c) - min_c bytes(c) <= B (round-robin dealing
//                  of a non-increasing sequence: chunk c's i-th leftover is
//                  >= chunk c+1's i-th and >= chunk 0's (i+1)-th);
//  - SG counts:    differ by at most 1 between chunks;
//  - elements:     differ by at most S (numel % S == 0) or 2S - 1 (a partial
//                  last SG), S = super-group size;
//  - runs:         at most one run per width per chunk.
// Naive reorder-then-split would hand one rank every 8-bit SG and make each
// ring step as slow as that rank; this dealing does not.
//
// kNatural (ablation): source order, chunk boundaries at the SG whose prefix
// of wire bytes is nearest to c * total / n; chunk bytes differ by <= 2B.
//
// kShards (reduce-scatter): the bucket is n equal shards of whole SGs and
// chunk c is exactly shard c (its SGs only, so that rank c decodes its output
// from what it receives); inside a chunk the SGs are grouped by width, widest
// first, one run per width, in source order. No balancing across chunks: a
// shard of wide SGs makes a larger chunk.
#pragma once

#include "kernels/codec.h"
#include "kernels/dynamiq/dynamiq_format.h"
#include "alloc/dynamiq_alloc.h"

namespace dynamiq {

enum class SgLayout : uint8_t { kBalancedByWidth = 0, kNatural = 1, kShards = 2 };

// Fills plan.unit (= fmt.S), plan.num_units, plan.order, plan.wire_offset and
// plan.chunk_begin from plan.numel and plan.bits (width per source SG, which
// must hold ceil(numel / S) entries, each in {1,2,4,8,16}). num_chunks >= 1:
// the world size for ring and twostep, the largest power of two <= world for
// butterfly; for kShards the number of shards, which must divide the number of
// SGs. Leaves dtype and bias alone. Throws Error on bad input.
void dynamiq_layout(Plan& plan, const DynamiqFormat& fmt, int num_chunks,
                    SgLayout layout = SgLayout::kBalancedByWidth);

// Allocation and layout in one call: a plan with dtype, numel, bits, order,
// wire_offset and chunk_begin set; bias left empty for the caller (the SG
// means). `result` (optional) receives what the allocator used.
Plan make_dynamiq_plan(DType dtype, int64_t numel, const float* sumsq, int64_t stride,
                       const AllocParams& params, AllocState& state, int num_chunks,
                       SgLayout layout = SgLayout::kBalancedByWidth, AllocResult* result = nullptr);

// The same into an existing plan, reusing its vectors' capacity (a cached plan
// per bucket avoids page-faulting ~13 bytes per SG of fresh memory each step).
// Returns what the allocator used.
AllocResult fill_dynamiq_plan(Plan& plan, DType dtype, int64_t numel, const float* sumsq, int64_t stride,
                              const AllocParams& params, AllocState& state, int num_chunks,
                              SgLayout layout = SgLayout::kBalancedByWidth);

}  // namespace dynamiq
