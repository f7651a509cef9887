// The topology registry and the transport factory in module dynamiq._C: see
// registry_bindings.h.
#include "hook/torch/registry_bindings.h"

namespace py = pybind11;

namespace dynamiq {

// A topology given by name or registry id, checked against the registry.
Topology topology_of(const py::object& v) {
  if (py::isinstance<py::str>(v)) return topology_id(v.cast<std::string>());
  DQ_CHECK(py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v),
           "dynamiq: a topology is a name or a registry id");
  const int64_t id = v.cast<int64_t>();
  DQ_CHECK(id >= 0 && id <= 255, "dynamiq: topology id " + std::to_string(id) + " is out of range");
  return topology_def(Topology(id)).id;  // (Error for an id nobody registered)
}

namespace {

// The topology registry as Python data: one dict per topology, by id.
py::list topologies_list() {
  py::list l;
  for (const TopologyInfo& t : registered_topologies()) {
    py::dict d;
    d["name"] = t.name;
    d["id"] = int(t.id);
    py::list kinds;
    for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather})
      if (t.collectives & collective_bit(c)) kinds.append(collective_name(c));
    d["collectives"] = kinds;
    d["composition"] = t.composition;
    l.append(std::move(d));
  }
  return l;
}

}  // namespace

void bind_topologies_and_transports(py::module_& m) {
  // The transport entries (hook/transport/transport_factory.h): Python checks
  // a tensor's device against its group's backends here before it queues.
  m.def(
      "transport_for",
      [](const std::string& backend_config, const std::string& device, bool staging) {
        const TransportEntry& e = choose_transport(parse_backend_config(backend_config), device, staging);
        py::dict d;
        d["backend"] = e.backend;
        d["device"] = e.device;
        d["host_staging"] = e.host_staging;
        d["ordered"] = e.semantics.ordered;
        d["shorter_receives"] = e.semantics.shorter_receives;
        return d;
      },
      py::arg("backend_config"), py::arg("device"), py::arg("staging") = false,
      "The transport entry for a tensor on `device` ('cpu', 'cuda') over a group whose backend string "
      "(torch.distributed.get_backend_config) is `backend_config`; DynamiqError naming the backend "
      "and the served pairs for one dynamiq cannot send over (ucc, mpi, ...).");
  // The topology registry (hook/collective/topology.h) is the one list of
  // topologies: Python takes names, ids and collectives from here.
  m.def("available_topologies", &topologies_list,
        "The registered topologies, by id: dicts of name, id, collectives ('all-reduce', "
        "'reduce-scatter', 'all-gather') and composition (True: collectives over sub-groups).");
  m.def("topology_id", [](const std::string& name) { return int(topology_id(name)); }, py::arg("name"),
        "The id of a registered topology (CollectiveConfig.topology); DynamiqError for an unknown name.");
}

}  // namespace dynamiq
