// The topology registry: see topology.h.
#include "hook/collective/topology.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <sstream>

namespace dynamiq {

// The built-in topologies, one line each: name (Config.topology), id (part of
// the wire fingerprint: never renumber or reuse one) and the function that
// returns the rest of the entry, defined in the topology's own file
// (ring_schedule.cc, butterfly_schedule.cc, twostep_schedule.cc,
// hierarchical.cc).
#define DQ_BUILTIN_TOPOLOGIES(X)          \
  X("ring", 0, ring_topology)             \
  X("butterfly", 1, butterfly_topology)   \
  X("twostep", 2, twostep_topology)       \
  X("hierarchical", 3, hierarchical_topology)

#define DQ_DECLARE_TOPOLOGY(name, id, def) TopologyDef def();
DQ_BUILTIN_TOPOLOGIES(DQ_DECLARE_TOPOLOGY)
#undef DQ_DECLARE_TOPOLOGY

namespace {

// Why `d` cannot be registered, "" if it can.
std::string entry_problem(const TopologyDef& d) {
  if (d.name.empty()) return "empty topology name";
  const std::string who = "topology '" + d.name + "'";
  if ((d.collectives & kEveryCollective) == 0 || (d.collectives & ~kEveryCollective) != 0)
    return who + " runs no collective, or one that does not exist";
  const bool schedule = d.schedule || d.tag_steps || d.rounds || d.bytes || d.chunks;
  if (schedule == d.composition()) return who + " must be either a schedule or a composition";
  if (schedule && !(d.schedule && d.tag_steps && d.rounds && d.bytes))
    return who + " needs a schedule function, its tag steps, and its cost (rounds, bytes)";
  if (d.composition() && d.collectives != kAllReduceOnly) return who + ": a composition runs all-reduces only";
  return "";
}

class TopologyRegistry {
 public:
  TopologyRegistry() {
#define DQ_ADD_TOPOLOGY(name, id, def) add_builtin(name, id, def());
    DQ_BUILTIN_TOPOLOGIES(DQ_ADD_TOPOLOGY)
#undef DQ_ADD_TOPOLOGY
  }

  void add(TopologyDef d) {
    const std::string problem = entry_problem(d);
    DQ_CHECK(problem.empty(), "register_topology: " + problem);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_) {
      DQ_CHECK(e->name != d.name, "register_topology: topology '" + d.name + "' is already registered");
      DQ_CHECK(e->id != d.id, "register_topology: topology '" + d.name + "': id " + std::to_string(int(d.id)) +
                                  " is taken by topology '" + e->name + "'");
    }
    entries_.push_back(std::make_unique<TopologyDef>(std::move(d)));
  }

  // Entries are never removed or moved: a pointer stays valid.
  const TopologyDef* find(Topology id) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_)
      if (e->id == id) return e.get();
    return nullptr;
  }

  const TopologyDef* find(std::string_view name) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_)
      if (e->name == name) return e.get();
    return nullptr;
  }

  // The entries by id (pointers: they stay valid).
  std::vector<const TopologyDef*> sorted() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<const TopologyDef*> v;
    for (const auto& e : entries_) v.push_back(e.get());
    std::sort(v.begin(), v.end(), [](const TopologyDef* a, const TopologyDef* b) { return a->id < b->id; });
    return v;
  }

 private:
  void add_builtin(const char* name, int id, TopologyDef d) {
    d.name = name;
    d.id = Topology(id);
    add(std::move(d));
  }

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<TopologyDef>> entries_;
};

// Built on first use (registration from static initialisers of other
// translation units works); never destroyed (threads may use it at exit).
TopologyRegistry& topologies() {
  static TopologyRegistry* r = new TopologyRegistry;
  return *r;
}

// The names of the entries `keep` accepts, by id, comma-separated.
template <class Keep>
std::string names_where(Keep&& keep) {
  std::ostringstream s;
  const char* sep = "";
  for (const TopologyDef* d : topologies().sorted()) {
    if (!keep(*d)) continue;
    s << sep << d->name;
    sep = ", ";
  }
  return s.str();
}

}  // namespace

void register_topology(TopologyDef def) { topologies().add(std::move(def)); }

std::vector<TopologyInfo> registered_topologies() {
  std::vector<TopologyInfo> out;
  for (const TopologyDef* d : topologies().sorted()) out.push_back({d->name, d->id, d->collectives, d->composition()});
  return out;
}

std::vector<Topology> schedule_topologies(Collective kind) {
  std::vector<Topology> out;
  for (const TopologyDef* d : topologies().sorted())
    if (!d->composition() && d->runs(kind)) out.push_back(d->id);
  return out;
}

Topology topology_id(std::string_view name) {
  const TopologyDef* d = topologies().find(name);
  if (!d)
    throw Error("unknown topology '" + std::string(name) +
                "' (registered: " + names_where([](const TopologyDef&) { return true; }) + ")");
  return d->id;
}

const char* topology_name(Topology t) {
  const TopologyDef* d = topologies().find(t);
  return d ? d->name.c_str() : "?";
}

const TopologyDef& topology_def(Topology t) {
  const TopologyDef* d = topologies().find(t);
  if (!d)
    throw Error("topology id " + std::to_string(int(t)) + " is not registered (registered topologies: " +
                names_where([](const TopologyDef&) { return true; }) + ")");
  return *d;
}

const TopologyDef& topology_for(Topology t, Collective kind) {
  const TopologyDef& d = topology_def(t);
  if (!d.runs(kind))
    throw Error(std::string("dynamiq ") + collective_name(kind) + ": topology '" + d.name + "' runs " +
                (d.collectives == kAllReduceOnly ? "all-reduces only" : "other collectives") + "; use " +
                names_where([kind](const TopologyDef& e) { return e.runs(kind); }));
  return d;
}

}  // namespace dynamiq
