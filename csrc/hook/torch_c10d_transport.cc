#include "torch_c10d_transport.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

namespace dynamiq {
namespace {

std::string peer_error(const char* what, int peer, uint32_t tag, const std::exception& e) {
  return std::string("dynamiq: ") + what + " rank " + std::to_string(peer) + " (tag " +
         std::to_string(tag) + ") failed: " + e.what();
}

class WorkRequest final : public Request {
 public:
  WorkRequest(c10::intrusive_ptr<c10d::Work> w, const char* what, int peer, uint32_t tag)
      : work_(std::move(w)), what_(what), peer_(peer), tag_(tag) {}
  void wait() override {
    if (done_) return;
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw TransportError(peer_error(what_, peer_, tag_, e));
    }
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    if (!work_->isCompleted()) return false;
    wait();  // surfaces an error if it failed
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  const char* what_;
  int peer_;
  uint32_t tag_;
  bool done_ = false;
};

class DoneRequest final : public Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

at::Tensor byte_view(const void* buf, size_t bytes) {
  return at::from_blob(const_cast<void*>(buf), {int64_t(bytes)},
                       at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> pg)
    : pg_(std::move(pg)), rank_(pg_->getRank()), size_(pg_->getSize()) {}

C10dTransport C10dTransport::from_group_name(const std::string& name) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(name);
  } catch (const std::exception& e) {
    throw Error("dynamiq: cannot resolve process group '" + name + "': " + e.what());
  }
  if (!pg) throw Error("dynamiq: process group '" + name + "' not found");
  return C10dTransport(pg);
}

std::unique_ptr<Request> C10dTransport::irecv(void* buf, size_t bytes, int src, uint32_t tag) {
  if (bytes == 0) return std::make_unique<DoneRequest>();
  std::vector<at::Tensor> t{byte_view(buf, bytes)};
  try {
    return std::make_unique<WorkRequest>(pg_->recv(t, src, int(tag)), "receive from", src, tag);
  } catch (const std::exception& e) {
    throw TransportError(peer_error("receive from", src, tag, e));
  }
}

std::unique_ptr<Request> C10dTransport::isend(const void* buf, size_t bytes, int dst, uint32_t tag) {
  if (bytes == 0) return std::make_unique<DoneRequest>();
  std::vector<at::Tensor> t{byte_view(buf, bytes)};
  try {
    return std::make_unique<WorkRequest>(pg_->send(t, dst, int(tag)), "send to", dst, tag);
  } catch (const std::exception& e) {
    throw TransportError(peer_error("send to", dst, tag, e));
  }
}

void C10dTransport::allreduce_sum_i64(int64_t* data, size_t count) {
  at::Tensor t = at::from_blob(data, {int64_t(count)}, at::TensorOptions().dtype(at::kLong)).clone();
  std::vector<at::Tensor> ts{t};
  try {
    pg_->allreduce(ts)->wait();
  } catch (const std::exception& e) {
    throw TransportError(std::string("dynamiq: header all-reduce failed: ") + e.what());
  }
  std::memcpy(data, t.data_ptr<int64_t>(), count * sizeof(int64_t));
}

}  // namespace dynamiq
