// Transport over an existing c10d::ProcessGroup: Gloo on CPU buffers, NCCL on
// CUDA buffers, through the same send/recv calls, as the transport entry
// (transport_factory.h) chosen for the group's backends and the buffers'
// device says. The group is found by name with c10d::resolve_process_group, as
// torch's functional collectives do, instead of passing pybind11 ProcessGroup
// objects across extension modules.
//
// With a coalesced entry (NCCL) every operation is posted inside
// startCoalescing/endCoalescing (the executor's groups, or a group of its own),
// so that every torch version and group set-up runs a rank's operations on one
// stream in posting order (experiments/results/nccl_order/, model 2), and
// posts_in_order() is true (the entry's semantics): the executor then posts
// each step's send and receive as one group. A request made inside a group
// completes with the group's Work. Status: the CUDA side compiles in CI and
// has never run (no GPU). Over Gloo the default posting sends a two-part
// message as one (the entry's shorter_receives: Gloo completes a receive with
// a shorter message).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>

#include "hook/transport/transport_factory.h"

namespace dynamiq {

class C10dTransport final : public Transport {
 public:
  // device: where the buffers passed to irecv/isend live (CPU or a CUDA
  // device); entry: how the group's backend for them matches messages
  // (choose_transport). ordered: post as for NCCL even where the entry does
  // not ask for it (testing the NCCL posting over Gloo).
  C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::Device device, const TransportEntry& entry,
                bool ordered);
  // The process group of that name (Error if there is none).
  static c10::intrusive_ptr<c10d::ProcessGroup> resolve(const std::string& name);
  // The group's backend name per device type (transport_factory.h).
  static GroupBackends backends_of(c10d::ProcessGroup& pg);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override;
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override;
  void group_start() override;
  void group_end() override;
  bool posts_in_order() const override { return ordered_; }
  bool accepts_shorter_messages() const override { return shorter_; }
  void allreduce_sum_i64(int64_t* data, size_t count) override;

  // The Work of a coalesced group, filled in at group_end.
  struct GroupWork {
    c10::intrusive_ptr<c10d::Work> work;
  };

 private:
  std::unique_ptr<Request> post(bool send, void* buf, size_t bytes, int peer, uint32_t tag);
  void end_coalesced();

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  c10::Device device_;
  int rank_, size_;
  bool ordered_;
  bool shorter_;    // the entry's semantics
  bool coalesce_;   // the entry's: post inside coalesced groups (NCCL)
  int depth_ = 0;                     // group_start/group_end nesting
  std::shared_ptr<GroupWork> group_;  // the open coalesced group (coalesce_ only)
};

}  // namespace dynamiq
