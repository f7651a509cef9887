// A view of some ranks of a Transport as a transport of their own: rank i of
// the view is members[i] of the parent. Messages keep their tags (the
// hierarchical topology's sub-groups never share a pair of ranks, and its
// phases run one after the other). allreduce_sum_i64 runs over point-to-point
// messages among the members (tag kSubAllreduceTag), staged through `memory`
// when the parent's buffers live in a device's memory.
#pragma once

#include <vector>

#include "hook/transport/transport.h"
#include "kernels/codec.h"

namespace dynamiq {

class SubTransport final : public Transport {
 public:
  // Above every schedule tag (< 2^30, make_program in schedule.cc) and fits an int.
  static constexpr uint32_t kSubAllreduceTag = (1u << 30) + 17;

  // `members` (distinct parent ranks, the parent's rank among them) in view order.
  SubTransport(Transport& parent, std::vector<int> members, const Memory* memory = nullptr);

  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override {
    return parent_.irecv(buf, bytes, members_.at(size_t(src)), tag);
  }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override {
    return parent_.isend(buf, bytes, members_.at(size_t(dst)), tag);
  }
  void group_start() override { parent_.group_start(); }
  void group_end() override { parent_.group_end(); }
  bool posts_in_order() const override { return parent_.posts_in_order(); }
  bool accepts_shorter_messages() const override { return parent_.accepts_shorter_messages(); }
  // Every member sends its vector to every other one; each adds them in rank
  // order (integer sums: the same on every member).
  void allreduce_sum_i64(int64_t* data, size_t count) override;

  const std::vector<int>& members() const { return members_; }

 private:
  Transport& parent_;
  std::vector<int> members_;
  const Memory* memory_;
  int rank_ = -1;
};

}  // namespace dynamiq
