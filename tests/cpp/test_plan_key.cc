// A plan's identity (codec.h's PlanGeneration, plan_key.h): what the codecs
// cache their once-per-plan work under (DynamiQ's plan checks here; the CUDA
// codec's device copy in tests/cpp/cuda_plan_cache.cu). A cache keyed by
// identity must never take one plan for another: not a copy that was then
// changed, not a plan made where a freed one was, not a plan changed in place
// and touch()ed, not one whose arrays were resized.
#include <gtest/gtest.h>

#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/plan_key.h"
#include "test_dynamiq_util.h"

namespace dynamiq {
namespace {

using dqtest::uniform_plan;
using dqtest::whole;

TEST(PlanKey, EveryPlanMadeCopiedOrMovedHasItsOwnGeneration) {
  std::set<uint64_t> seen;
  auto fresh = [&](const Plan& p) { return seen.insert(p.generation()).second; };
  Plan a = uniform_plan(1000, 4);
  EXPECT_TRUE(fresh(a));
  Plan b = a;  // a copy
  EXPECT_TRUE(fresh(b));
  Plan c;
  EXPECT_TRUE(fresh(c));
  c = a;  // an assignment
  EXPECT_TRUE(fresh(c));
  const uint64_t a_gen = a.generation();
  Plan d = std::move(a);  // a move: both ends renewed (a's arrays are gone)
  EXPECT_TRUE(fresh(d));
  EXPECT_NE(a.generation(), a_gen);
  EXPECT_TRUE(fresh(a));
  c = std::move(d);
  EXPECT_TRUE(fresh(c));
  EXPECT_TRUE(fresh(d));
  const uint64_t before = b.generation();
  b.touch();
  EXPECT_NE(b.generation(), before);
  EXPECT_TRUE(fresh(b));
  // a key holds what an O(1) look sees: equal for the same plan, unequal once an array changes size
  Plan e = uniform_plan(1000, 4);
  EXPECT_EQ(plan_key(e), plan_key(e));
  const PlanKey k = plan_key(e);
  e.bits.push_back(4);
  EXPECT_NE(plan_key(e), k);
}

// The DynamiQ codec checks a plan once, then only each call's block: a plan
// that differs from one it checked, in any of the ways the rule allows, is
// checked again (and here refused).
TEST(PlanKey, DynamiqChecksEveryPlanItHasNotSeen) {
  const DynamiqCodec codec;
  auto refused = [&](const Plan& q) {
    try {
      codec.static_bytes(q, whole(q));
    } catch (const Error& e) {
      return std::string(e.what()).find("dynamiq codec") != std::string::npos;
    }
    return false;
  };
  const Plan good = uniform_plan(1000, 4);
  const size_t bytes = codec.static_bytes(good, whole(good));
  EXPECT_EQ(bytes, size_t(4 * dynamiq_sg_bytes(4, DynamiqFormat())));

  // a copy, then changed: a new plan
  Plan copy = good;
  EXPECT_EQ(codec.static_bytes(copy, whole(copy)), bytes);
  Plan changed = copy;
  changed.bits[1] = 3;
  EXPECT_TRUE(refused(changed));
  EXPECT_EQ(codec.static_bytes(good, whole(good)), bytes);  // the original still passes

  // changed in place after a codec saw it, then touch()ed: checked again
  copy.bits[1] = 3;
  copy.touch();
  EXPECT_TRUE(refused(copy));

  // an array resized (against the rule: no touch()): the key sees it
  Plan grown = good;
  EXPECT_EQ(codec.static_bytes(grown, whole(grown)), bytes);
  grown.order = {0, 1, 2, 9};
  EXPECT_TRUE(refused(grown));

  // a plan freed, another made in its place (same address, same array sizes: the
  // allocator may even hand it the same array memory): the new one is checked
  alignas(Plan) unsigned char where[sizeof(Plan)];
  Plan* p = new (where) Plan(uniform_plan(1000, 4));
  EXPECT_EQ(codec.static_bytes(*p, whole(*p)), bytes);
  p->~Plan();
  Plan* q = new (where) Plan(uniform_plan(1000, 4));
  q->wire_offset[2] += 1;  // before any codec saw it: no touch() needed
  EXPECT_TRUE(refused(*q));
  q->~Plan();

  // the block is still checked on every call, against the plan's size
  EXPECT_THROW(codec.static_bytes(good, Block{0, good.num_units + 1}), Error);
  EXPECT_THROW(codec.static_bytes(good, Block{2, 1}), Error);
  EXPECT_THROW(codec.static_bytes(good, Block{-1, 1}), Error);
  EXPECT_EQ(codec.static_bytes(good, Block{1, 3}), size_t(2 * dynamiq_sg_bytes(4, DynamiqFormat())));
}

// The checks moved from each call's block to the whole plan: a bad unit
// outside the block is refused too, and now also a bias of the wrong size
// (read per source unit, by the CUDA kernels too).
TEST(PlanKey, DynamiqChecksTheWholePlan) {
  const DynamiqCodec codec;
  Plan p = uniform_plan(256 * 8, 4);
  p.bits[7] = 5;
  try {
    codec.static_bytes(p, Block{0, 1});
    ADD_FAILURE() << "a width of 5 passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("width 5"), std::string::npos) << e.what();
  }
  Plan b = uniform_plan(256 * 8, 4);
  b.bias.assign(3, 0.5f);
  try {
    codec.static_bytes(b, Block{0, 1});
    ADD_FAILURE() << "a bias of 3 entries for 8 units passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.bias"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dynamiq
