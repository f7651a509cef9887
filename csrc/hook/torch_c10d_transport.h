// Transport over an existing c10d::ProcessGroup (Gloo on CPU; the same calls
// serve NCCL on GPU). The group is found by name with
// c10d::resolve_process_group, as torch's functional collectives do, instead
// of passing pybind11 ProcessGroup objects across extension modules.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "transport.h"

namespace dynamiq {

class C10dTransport final : public Transport {
 public:
  explicit C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> pg);
  static C10dTransport from_group_name(const std::string& name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override;
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override;
  void allreduce_sum_i64(int64_t* data, size_t count) override;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int rank_, size_;
};

}  // namespace dynamiq
