// Which transport carries a collective's buffers over a process group: one
// entry per (backend, tensor device), each declaring how the backend matches
// messages (MessageSemantics), so the executor's posting follows from the
// entry and is never guessed from a name. The torch binding (run_on_group)
// asks choose_transport with the group's backends as c10d reports them and
// builds what the entry names (C10dTransport, wrapped in a StagingTransport
// for host staging); Python asks the same function (_C.transport_for) with
// the group's backend string before it queues a collective. Torch-free, so
// its choices and refusals are tested with any backend name.
//
// Entries: gloo carries CPU tensors; nccl carries CUDA tensors; gloo carries
// CUDA tensors staged through page-locked host memory (staging_transport.h),
// on request (Config.host_staging) or where the group has no NCCL. Any other
// backend (ucc, mpi, a custom one) is refused with a message naming it and
// what is served: its matching rules (tags, shorter receives, ordering) have
// not been checked against the executor's posting.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hook/transport/transport.h"

namespace dynamiq {

struct TransportEntry {
  std::string backend;  // the c10d backend that moves the bytes ("gloo", "nccl")
  std::string device;   // the tensor's device type ("cpu", "cuda")
  // CUDA buffers staged through page-locked host memory over the backend's
  // CPU side (StagingTransport around a C10dTransport on CPU buffers).
  bool host_staging = false;
  // Operations are posted inside startCoalescing/endCoalescing (NCCL: every
  // rank's operations then run on one stream in posting order).
  bool coalesced = false;
  MessageSemantics semantics;
  // "gloo (cpu)", "gloo (cuda, staged through host memory)"
  std::string describe() const;
};

// The group's backend name per device type ("cpu" -> "gloo", "cuda" ->
// "nccl"), as c10d's Backend::getBackendName reports it; a device type the
// group has no backend for is absent.
using GroupBackends = std::map<std::string, std::string, std::less<>>;

// A backend string as torch.distributed.get_backend_config gives it: "gloo",
// "cpu:gloo,cuda:nccl". A name without a device applies to cpu and cuda.
// Names are lower-cased.
GroupBackends parse_backend_config(std::string_view config);

// The entry for a tensor on `device` ("cpu" or "cuda") over a group with
// `backends`. A CUDA tensor takes the group's CUDA backend directly, or when
// `staging` is asked for or that backend carries no CUDA tensors, host
// staging over its CPU backend. Throws Error naming the group's backends, the
// device and the served pairs when none fits.
const TransportEntry& choose_transport(const GroupBackends& backends, std::string_view device, bool staging);

// Every entry, as choose_transport picks from them.
const std::vector<TransportEntry>& transport_entries();

}  // namespace dynamiq
