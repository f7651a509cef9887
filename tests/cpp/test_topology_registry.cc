// The topology registry (hook/collective/topology.h): the built-in entries
// keep the ids the config fingerprint encodes, lookups name what is
// registered, registration refuses what the driver could not run, and a
// schedule's ops stay inside the tag space it declares. (Entries registered
// here would stay for the process and join every test's topology loop: only
// entries that are refused are tried.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hook/collective/topology.h"
#include "kernels/identity/identity_codec.h"

namespace dynamiq {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TopologyRegistry, BuiltInIdsAreTheFingerprintsOnes) {
  EXPECT_EQ(topology_id("ring"), Topology(0));
  EXPECT_EQ(topology_id("butterfly"), Topology(1));
  EXPECT_EQ(topology_id("twostep"), Topology(2));
  EXPECT_EQ(topology_id("hierarchical"), Topology(3));
  EXPECT_EQ(kTopologyRing, topology_id("ring"));
  EXPECT_EQ(kTopologyHierarchical, topology_id("hierarchical"));
  for (const char* name : {"ring", "butterfly", "twostep", "hierarchical"})
    EXPECT_STREQ(topology_name(topology_id(name)), name);
  EXPECT_STREQ(topology_name(Topology(250)), "?");
}

TEST(TopologyRegistry, SchedulesRunEveryCollectiveAndHierarchicalIsAnAllReduceComposition) {
  for (const char* name : {"ring", "butterfly", "twostep"}) {
    const TopologyDef& d = topology_def(topology_id(name));
    EXPECT_FALSE(d.composition()) << name;
    EXPECT_EQ(d.collectives, kEveryCollective) << name;
  }
  const TopologyDef& h = topology_def(kTopologyHierarchical);
  EXPECT_TRUE(h.composition());
  EXPECT_EQ(h.collectives, kAllReduceOnly);
  for (Collective k : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather}) {
    const std::vector<Topology> s = schedule_topologies(k);
    EXPECT_EQ(std::count(s.begin(), s.end(), kTopologyHierarchical), 0) << "a composition is no schedule";
    for (const char* name : {"ring", "butterfly", "twostep"})
      EXPECT_EQ(std::count(s.begin(), s.end(), topology_id(name)), 1) << name << " " << collective_name(k);
    EXPECT_TRUE(std::is_sorted(s.begin(), s.end())) << "by id";
  }
  const std::vector<TopologyInfo> all = registered_topologies();
  ASSERT_GE(all.size(), 4u);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LT(all[i - 1].id, all[i].id);
}

TEST(TopologyRegistry, UnknownNamesAndIdsAreErrorsNamingTheRegistered) {
  const std::string e = error_of([] { topology_id("mesh"); });
  EXPECT_NE(e.find("unknown topology 'mesh'"), std::string::npos) << e;
  EXPECT_NE(e.find("ring, butterfly, twostep, hierarchical"), std::string::npos) << e;
  const std::string f = error_of([] { topology_def(Topology(251)); });
  EXPECT_NE(f.find("topology id 251 is not registered"), std::string::npos) << f;
  const std::string g = error_of([] { topology_for(kTopologyHierarchical, Collective::kAllGather); });
  EXPECT_NE(g.find("topology 'hierarchical' runs all-reduces only; use ring, butterfly, twostep"),
            std::string::npos) << g;
}

// A schedule entry that would pass registration (nothing registered here).
TopologyDef schedule_like(const std::string& name, Topology id) {
  TopologyDef d;
  d.name = name;
  d.id = id;
  d.schedule = [](ScheduleBuilder& b, int, int, Collective kind) { b.world_of_one(kind); };
  d.tag_steps = [](int, Collective) { return int64_t(1); };
  d.rounds = [](int) { return 1.0; };
  d.bytes = [](int) { return 1.0; };
  return d;
}

TEST(TopologyRegistry, RegistrationRefusesWhatTheDriverCouldNotRun) {
  auto refused = [](TopologyDef d, const std::string& why) {
    const std::string e = error_of([&] { register_topology(std::move(d)); });
    EXPECT_NE(e.find(why), std::string::npos) << "want '" << why << "', got '" << e << "'";
  };
  refused(schedule_like("ring", Topology(240)), "topology 'ring' is already registered");
  refused(schedule_like("fresh", Topology(1)), "id 1 is taken by topology 'butterfly'");
  refused(schedule_like("", Topology(240)), "empty topology name");
  TopologyDef none = schedule_like("nothing", Topology(240));
  none.collectives = 0;
  refused(none, "runs no collective");
  TopologyDef no_cost = schedule_like("no_cost", Topology(240));
  no_cost.rounds = nullptr;
  refused(no_cost, "needs a schedule function, its tag steps, and its cost");
  TopologyDef both = schedule_like("both", Topology(240));
  both.compose = topology_def(kTopologyHierarchical).compose;
  refused(both, "either a schedule or a composition");
  TopologyDef empty;
  empty.name = "empty";
  empty.id = Topology(240);
  refused(empty, "either a schedule or a composition");
  TopologyDef wide;
  wide.name = "wide";
  wide.id = Topology(240);
  wide.compose = topology_def(kTopologyHierarchical).compose;
  wide.collectives = kEveryCollective;
  refused(wide, "a composition runs all-reduces only");
  EXPECT_EQ(topology_name(Topology(240)), std::string("?")) << "a refused entry was registered";
}

// The builder enforces the declared tag space op by op, so a schedule whose
// tags outgrow its TopologyDef::tag_steps fails at once, naming itself.
TEST(TopologyRegistry, BuilderRefusesTagsOutsideTheDeclaredSpace) {
  const Plan plan = make_identity_plan(DType::kF32, 4 * 4096, 4);
  const BlockTable bt = make_blocks(plan, 4096);  // 4 chunks x 4 blocks
  ScheduleBuilder b(bt, 2 * 4 * 4, "test");      // 2 steps
  EXPECT_TRUE(b.add(Role::kSendLeaf, 1, 2, 1, b.tag(1, 3, 3)));  // the last tag of the space
  const std::string e = error_of([&] { b.add(Role::kSendLeaf, 1, 2, 1, b.tag(2, 0, 0)); });
  EXPECT_NE(e.find("topology 'test': tag 32 outside its declared tag space of 32"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { b.add(Role::kSendLeaf, 4, 0, 1, 0); }).find("outside the block table"), std::string::npos);
  EXPECT_TRUE(b.add(Role::kLocalSink, 0, 0, -1, 12345)) << "a local op has no tag";
  EXPECT_EQ(b.take().ops.size(), 2u);
}

// Every registered schedule's tags, for every collective it runs, on 1..17
// ranks: inside its declared space (the builder would have thrown), and the
// space it declares within 2^30 as make_program checks before building.
TEST(TopologyRegistry, EveryScheduleStaysInItsTagSpace) {
  for (Collective kind : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather})
    for (Topology t : schedule_topologies(kind))
      for (int n = 1; n <= 17; ++n) {
        const int C = topology_chunks(t, n, kind);
        const Plan plan = make_identity_plan(DType::kF32, int64_t(C) * 3 * 4096, C);
        const BlockTable bt = make_blocks(plan, 4096);
        const int64_t space = n > 1 ? topology_def(t).tag_steps(n, kind) * C * bt.blocks_per_chunk : 1;
        for (int r = 0; r < n; ++r)
          for (const Op& op : make_program(t, r, n, bt, kind).ops)
            if (op.peer >= 0) ASSERT_LT(int64_t(op.tag), space) << topology_name(t) << " n=" << n;
      }
}

}  // namespace
}  // namespace dynamiq
