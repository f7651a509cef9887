#include "hook/torch/torch_c10d_transport.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

namespace dynamiq {
namespace {

std::string peer_error(const char* what, int peer, uint32_t tag, const std::exception& e) {
  return std::string("dynamiq: ") + what + " rank " + std::to_string(peer) + " (tag " +
         std::to_string(tag) + ") failed: " + e.what();
}

// A posted operation: its own Work, and/or (inside a coalesced group) the
// group's, known once the group has ended.
class WorkRequest final : public Request {
 public:
  WorkRequest(c10::intrusive_ptr<c10d::Work> w, std::shared_ptr<C10dTransport::GroupWork> g,
              const char* what, int peer, uint32_t tag)
      : work_(std::move(w)), group_(std::move(g)), what_(what), peer_(peer), tag_(tag) {}
  void wait() override {
    if (done_) return;
    try {
      if (work_) work_->wait();
      if (group_) {
        DQ_CHECK(group_->work, "dynamiq: waiting on an operation of a group that has not ended");
        group_->work->wait();
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw TransportError(peer_error(what_, peer_, tag_, e));
    }
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    if (work_ && !work_->isCompleted()) return false;
    if (group_ && (!group_->work || !group_->work->isCompleted())) return false;
    wait();  // surfaces an error if it failed
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::shared_ptr<C10dTransport::GroupWork> group_;
  const char* what_;
  int peer_;
  uint32_t tag_;
  bool done_ = false;
};

}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::Device device,
                             const TransportEntry& entry, bool ordered)
    : pg_(std::move(pg)),
      device_(device),
      rank_(pg_->getRank()),
      size_(pg_->getSize()),
      ordered_(ordered || entry.semantics.ordered),
      shorter_(entry.semantics.shorter_receives),
      coalesce_(entry.coalesced) {
  DQ_CHECK(device_.is_cuda() == (entry.device == "cuda" && !entry.host_staging),
           "dynamiq: transport entry " + entry.describe() + " used for buffers on " + device_.str());
}

c10::intrusive_ptr<c10d::ProcessGroup> C10dTransport::resolve(const std::string& name) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(name);
  } catch (const std::exception& e) {
    throw Error("dynamiq: cannot resolve process group '" + name + "': " + e.what());
  }
  if (!pg) throw Error("dynamiq: process group '" + name + "' not found");
  return pg;
}

GroupBackends C10dTransport::backends_of(c10d::ProcessGroup& pg) {
  GroupBackends out;
  for (const auto& [type, name] : {std::pair{c10::DeviceType::CPU, "cpu"}, std::pair{c10::DeviceType::CUDA, "cuda"}}) {
    try {
      out[name] = pg.getBackend(type)->getBackendName();
    } catch (const std::exception&) {
      // no backend for that device type
    }
  }
  return out;
}

// Coalesced groups start at their first operation (an empty group would make
// NCCL end a group with nothing in it) and end at the outermost group_end.
void C10dTransport::group_start() { ++depth_; }

void C10dTransport::group_end() {
  DQ_CHECK(depth_ > 0, "dynamiq: group_end without group_start");
  if (--depth_ == 0) end_coalesced();
}

void C10dTransport::end_coalesced() {
  if (!group_) return;
  std::shared_ptr<GroupWork> g = std::move(group_);
  try {
    g->work = pg_->endCoalescing(device_.type());
  } catch (const std::exception& e) {
    throw TransportError(std::string("dynamiq: endCoalescing failed: ") + e.what());
  }
}

std::unique_ptr<Request> C10dTransport::post(bool send, void* buf, size_t bytes, int peer, uint32_t tag) {
  if (bytes == 0) return std::make_unique<DoneRequest>();
  const char* what = send ? "send to" : "receive from";
  if (coalesce_ && !group_) {  // CUDA buffers: every operation inside a group (see the header)
    try {
      pg_->startCoalescing(device_.type());
    } catch (const std::exception& e) {
      throw TransportError(std::string("dynamiq: startCoalescing failed: ") + e.what());
    }
    group_ = std::make_shared<GroupWork>();
  }
  std::unique_ptr<Request> req;
  try {
    std::vector<at::Tensor> t{at::from_blob(buf, {int64_t(bytes)},
                                            at::TensorOptions().dtype(at::kByte).device(device_))};
    c10::intrusive_ptr<c10d::Work> w = send ? pg_->send(t, peer, int(tag)) : pg_->recv(t, peer, int(tag));
    // inside a coalesced group the group's Work stands for its operations (as
    // in batch_isend_irecv); an operation's own Work is not meaningful there
    if (group_) w.reset();
    req = std::make_unique<WorkRequest>(std::move(w), group_, what, peer, tag);
  } catch (const std::exception& e) {
    throw TransportError(peer_error(what, peer, tag, e));
  }
  if (depth_ == 0) end_coalesced();  // an operation outside any group: a group of its own
  return req;
}

std::unique_ptr<Request> C10dTransport::irecv(void* buf, size_t bytes, int src, uint32_t tag) {
  return post(false, buf, bytes, src, tag);
}

std::unique_ptr<Request> C10dTransport::isend(const void* buf, size_t bytes, int dst, uint32_t tag) {
  return post(true, const_cast<void*>(buf), bytes, dst, tag);
}

void C10dTransport::allreduce_sum_i64(int64_t* data, size_t count) {
  at::Tensor host = at::from_blob(data, {int64_t(count)}, at::TensorOptions().dtype(at::kLong));
  // on the buffers' device: NCCL all-reduces CUDA tensors only
  std::vector<at::Tensor> ts{host.to(device_, /*non_blocking=*/false, /*copy=*/true)};
  try {
    pg_->allreduce(ts)->wait();
  } catch (const std::exception& e) {
    throw TransportError(std::string("dynamiq: header all-reduce failed: ") + e.what());
  }
  host.copy_(ts[0].cpu());
}

}  // namespace dynamiq
