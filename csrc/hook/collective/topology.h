// The topology registry: the one place a topology is listed (as
// kernels/registry.h is for modes). An entry maps
//   name (Config.topology) -> id (CollectiveConfig::topology, part of the
//   wire fingerprint) -> which collectives it runs -> either
//     a schedule: its chunks, its tag space, its function (ScheduleBuilder)
//     and its cost for mode auto (rounds, bytes), or
//     a composition: a driver that runs the collective as collectives over
//     sub-groups (hierarchical.h), with its own config rules.
// The built-in topologies are one line each in topology_registry.cc;
// register_topology adds one at run time (tests/cpp/star_topology registers a
// test-only schedule this way). docs/architecture.md "Adding a topology" has
// the steps.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hook/collective/config.h"
#include "hook/collective/schedule.h"

namespace dynamiq {

struct CallArgs;   // collective.h
struct CallStats;  // collective.h
class Transport;   // transport.h

// Which collectives an entry runs: a bit per Collective.
using CollectiveSet = uint32_t;
constexpr CollectiveSet collective_bit(Collective c) { return CollectiveSet(1) << unsigned(c); }
constexpr CollectiveSet kAllReduceOnly = collective_bit(Collective::kAllReduce);
constexpr CollectiveSet kEveryCollective = collective_bit(Collective::kAllReduce) |
                                           collective_bit(Collective::kReduceScatter) |
                                           collective_bit(Collective::kAllGather);

struct TopologyDef {
  std::string name;
  Topology id{};
  CollectiveSet collectives = kAllReduceOnly;

  // A schedule (null for a composition).
  // The ops of `rank` (schedule.h: roles, ScheduleBuilder); `kind` is one of
  // `collectives`, world >= 1.
  std::function<void(ScheduleBuilder& b, int rank, int world, Collective kind)> schedule;
  // Chunks of the plan on `world` ranks (null: world, one per rank). For a
  // reduce-scatter or all-gather it must be world (chunk c = shard c).
  std::function<int(int world, Collective kind)> chunks;
  // The tag space: every message tag of every rank lies below
  // tag_steps(world, kind) x chunks x blocks per chunk (ScheduleBuilder::tag
  // numbers (step, chunk, block) so). Checked against 2^30 before any rank
  // builds its ops, and op by op while it does.
  std::function<int64_t(int world, Collective kind)> tag_steps;
  // Mode auto's cost model (auto_mode.h) for an all-reduce on n ranks:
  // rounds of messages one after the other (each pays the link latency), and
  // bytes the busiest rank sends per byte of the bucket.
  std::function<double(int n)> rounds;
  std::function<double(int n)> bytes;

  // A composition (null for a schedule): runs an all-reduce itself, as
  // collectives over sub-groups (SubTransport), with the header exchange of
  // the whole group first (hierarchical_all_reduce).
  CallStats (*compose)(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a) = nullptr;

  // Optional: the topology's own config rules (Error for a config it
  // cannot run, named in the message); validate_config calls it.
  std::function<void(const CollectiveConfig& cfg)> validate;
  // Optional: "" or why every rank of a group of `world` ranks would refuse
  // cfg at its first collective (rules that need the world size); asked up
  // front by tools before they start any (Python: config.run_problem).
  std::function<std::string(const CollectiveConfig& cfg, int world)> group_problem;

  bool composition() const { return compose != nullptr; }
  bool runs(Collective c) const { return (collectives & collective_bit(c)) != 0; }
};

// Adds a topology. Throws Error for an empty name, a name or id that is
// taken, an entry that is neither or both a schedule (schedule, tag_steps,
// rounds, bytes) and a composition, or one that runs no collective.
// Entries stay for the life of the process.
void register_topology(TopologyDef def);

struct TopologyInfo {
  std::string name;
  Topology id;
  CollectiveSet collectives;
  bool composition;
};
// Every registered topology, by id.
std::vector<TopologyInfo> registered_topologies();
// The registered schedules (not compositions) that run `kind`, by id: what
// the tests iterate over.
std::vector<Topology> schedule_topologies(Collective kind = Collective::kAllReduce);
// The id of a registered topology; throws Error naming the registered ones.
Topology topology_id(std::string_view name);
// The name of a registered topology, "?" for an id nobody registered.
const char* topology_name(Topology t);
// A registered topology's entry (never moves); throws Error for an id nobody
// registered.
const TopologyDef& topology_def(Topology t);
// topology_def(t), checked to run `kind`: throws Error naming the topologies
// that do.
const TopologyDef& topology_for(Topology t, Collective kind);

}  // namespace dynamiq
