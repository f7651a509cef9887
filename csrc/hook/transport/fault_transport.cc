#include "hook/transport/fault_transport.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>

namespace dynamiq {

const char* fault_name(FaultKind k) {
  switch (k) {
    case FaultKind::kNone: return "none";
    case FaultKind::kDrop: return "drop";
    case FaultKind::kTruncate: return "truncate";
    case FaultKind::kDuplicate: return "duplicate";
    case FaultKind::kReorder: return "reorder";
    case FaultKind::kBitFlip: return "bit-flip";
    case FaultKind::kDelay: return "delay";
    case FaultKind::kClose: return "close";
  }
  return "?";
}

namespace {

class Completed final : public Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// A request of the wrapped transport that first delivers a held message (kReorder), so a rank
// never blocks on a peer that waits for the message it holds.
class Flushing final : public Request {
 public:
  Flushing(std::unique_ptr<Request> in, std::function<void()> flush) : in_(std::move(in)), flush_(std::move(flush)) {}
  void wait() override {
    flush_();
    in_->wait();
  }
  bool test() override { return in_->test(); }

 private:
  std::unique_ptr<Request> in_;
  std::function<void()> flush_;
};

}  // namespace

FaultTransport::FaultTransport(Transport& inner, const FaultSpec& spec)
    : inner_(inner), spec_(spec), mine_(spec.kind != FaultKind::kNone && spec.rank == inner.rank()) {}

FaultTransport::~FaultTransport() = default;

void FaultTransport::before_op() {
  if (closed_)
    throw TransportError("fault injection: rank " + std::to_string(rank()) + "'s connection is closed");
  if (holding_) {
    holding_ = false;
    internal_.push_back(post_copy(held_, held_dst_, held_tag_));
  }
}

std::unique_ptr<Request> FaultTransport::post_copy(const std::vector<uint8_t>& bytes, int dst, uint32_t tag) {
  auto copy = std::make_shared<std::vector<uint8_t>>(bytes);
  copies_.push_back(copy);
  return inner_.isend(copy->data(), copy->size(), dst, tag);
}

std::unique_ptr<Request> FaultTransport::irecv(void* buf, size_t bytes, int src, uint32_t tag) {
  before_op();
  return std::make_unique<Flushing>(inner_.irecv(buf, bytes, src, tag), [this] { before_op(); });
}

std::unique_ptr<Request> FaultTransport::isend(const void* buf, size_t bytes, int dst, uint32_t tag) {
  if (closed_) before_op();  // raises
  const int64_t k = sends_++;
  if (!mine_ || spec_.header_after >= 0 || k != spec_.message) {
    auto r = inner_.isend(buf, bytes, dst, tag);
    before_op();  // a held message goes after this one: overtaken
    return std::make_unique<Flushing>(std::move(r), [this] { before_op(); });
  }
  before_op();
  fired_ = true;
  faulted_bytes_ = bytes;
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  std::vector<uint8_t> msg(p, p + bytes);
  switch (spec_.kind) {
    case FaultKind::kDrop:
      return std::make_unique<Completed>();
    case FaultKind::kTruncate:
      msg.resize(std::min(spec_.keep_bytes, bytes));
      return post_copy(msg, dst, tag);
    case FaultKind::kDuplicate: {
      auto r = inner_.isend(buf, bytes, dst, tag);
      internal_.push_back(post_copy(msg, dst, tag));
      return r;
    }
    case FaultKind::kReorder:
      holding_ = true;
      held_ = std::move(msg);
      held_dst_ = dst;
      held_tag_ = tag;
      return std::make_unique<Completed>();
    case FaultKind::kBitFlip:
      if (bytes > 0) {
        const uint64_t b = uint64_t(spec_.bit) % (8 * uint64_t(bytes));
        msg[size_t(b / 8)] ^= uint8_t(1u << (b % 8));
      }
      return post_copy(msg, dst, tag);
    case FaultKind::kDelay:
      std::this_thread::sleep_for(spec_.delay);
      return inner_.isend(buf, bytes, dst, tag);
    case FaultKind::kClose:
      closed_ = true;
      before_op();  // raises
      break;
    case FaultKind::kNone:
      break;
  }
  return inner_.isend(buf, bytes, dst, tag);
}

void FaultTransport::group_start() {
  before_op();
  inner_.group_start();
}

void FaultTransport::group_end() {
  inner_.group_end();
  before_op();
}

void FaultTransport::allreduce_sum_i64(int64_t* data, size_t count) {
  before_op();
  const int64_t k = allreduces_++;
  if (mine_ && spec_.header_after >= 0 && k == spec_.header_after) {
    fired_ = true;
    switch (spec_.kind) {
      case FaultKind::kBitFlip:
        if (count > 0) {
          const uint64_t b = uint64_t(spec_.bit) % (64 * uint64_t(count));
          data[b / 64] = int64_t(uint64_t(data[b / 64]) ^ (uint64_t(1) << (b % 64)));
        }
        break;
      case FaultKind::kDelay:
        std::this_thread::sleep_for(spec_.delay);
        break;
      case FaultKind::kClose:
      case FaultKind::kDrop:
        closed_ = true;
        before_op();  // raises
        break;
      default:
        break;
    }
  }
  inner_.allreduce_sum_i64(data, count);
}

}  // namespace dynamiq
