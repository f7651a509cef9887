// Point-to-point byte transport under the collective driver. Two
// implementations move bytes: C10dTransport (send/recv on a
// c10d::ProcessGroup: Gloo on CPU, NCCL on GPU; which one, and how it matches
// messages, from transport_factory.h) and InprocTransport (threads in one
// process, for dynamiq.simulate and the GoogleTest schedules). Three wrap
// another transport: StagingTransport (device buffers through host memory),
// SubTransport (a sub-group's view, hierarchical.h) and FaultTransport
// (injected failures, tests). The driver only ever talks to this interface,
// so a simulated run sends exactly the bytes a real run sends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/base/common.h"

namespace dynamiq {

class TransportError : public Error {
 public:
  explicit TransportError(const std::string& what) : Error(what) {}
};

// One posted send or receive. wait() blocks until it completes and throws
// TransportError on failure or timeout.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  // Non-blocking completion check (may return false conservatively).
  virtual bool test() { return false; }
};

// A request complete when posted (an eager send's bytes already copied; a
// zero-byte operation).
class DoneRequest final : public Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// How a backend matches messages: what the executor's posting relies on
// (Transport::posts_in_order, accepts_shorter_messages). Declared per
// transport entry (transport_factory.h) for the c10d backends.
struct MessageSemantics {
  // Operations match in posting order and tags are ignored (NCCL).
  bool ordered = false;
  // A receive posted for more bytes completes with a shorter message (Gloo);
  // else receives are posted for the exact size.
  bool shorter_receives = false;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Messages between a pair of ranks are matched in posting order per tag;
  // the driver gives every message of one collective its own tag. NCCL ignores
  // tags and runs operations in posting order: for it the executor posts
  // differently (see posts_in_order). A receive is posted with the
  // exact size of the message (or a larger one: see accepts_shorter_messages).
  virtual std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) = 0;
  virtual std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) = 0;

  // Brackets for posts that must be issued together (NCCL group semantics);
  // no-ops for transports without that constraint.
  virtual void group_start() {}
  virtual void group_end() {}

  // True when the backend matches operations in posting order and ignores
  // tags (NCCL: a rank's operations run in posting order on one stream, or on
  // one stream per pair of ranks, depending on how torch set the group up).
  // The executor then posts receives in program order and each step's send
  // and receive as one group, an order that runs under both (checked by
  // InprocWorld::nccl_stream_deadlock and nccl_order_violations).
  virtual bool posts_in_order() const { return false; }

  // True when a receive may be posted for more bytes than its message has and
  // a shorter message completes it (Gloo). The executor then sends a two-part
  // message (lossless) as one message and posts its receive ahead for the
  // largest size, reading the true size from the message's header. Otherwise
  // the second part's receive can only be posted once the first part has told
  // its size; Gloo sends a message only after its receive is posted, so that
  // costs a round trip per block, queued behind the data on the link.
  virtual bool accepts_shorter_messages() const { return false; }
  // The executor's resulting choice: two-part messages travel as one.
  bool sends_whole_messages() const { return !posts_in_order() && accepts_shorter_messages(); }

  // Elementwise sum of small int64 vectors over all ranks (the header
  // exchange). Integer sums are exact in any order, so every rank gets the
  // same answer from any backend.
  virtual void allreduce_sum_i64(int64_t* data, size_t count) = 0;
};

}  // namespace dynamiq
