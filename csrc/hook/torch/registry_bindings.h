// The Python view (module dynamiq._C) of the topology registry
// (hook/collective/topology.h) and the transport factory
// (hook/transport/transport_factory.h): what Config, the sharded collectives'
// checks and the group set-up ask instead of keeping lists of their own.
#pragma once

#include <torch/extension.h>

#include "hook/collective/topology.h"
#include "hook/transport/transport_factory.h"

namespace dynamiq {

// A topology given by name or registry id, checked against the registry
// (Error for an unknown name, an id nobody registered, or another type).
Topology topology_of(const pybind11::object& v);

// Adds available_topologies, topology_id and transport_for to the module.
void bind_topologies_and_transports(pybind11::module_& m);

}  // namespace dynamiq
