// A transport that injects one fault into the messages of one rank, for tests of what the
// collective does when the network or a peer misbehaves (tests/cpp/test_faults.cc,
// docs/reliability.md). It wraps any Transport (in the tests: a rank's InprocTransport) and
// passes everything through, except at the chosen point-to-point send of the chosen rank:
//
//   kDrop       the message is never delivered (the send completes locally);
//   kTruncate   only its first `keep_bytes` bytes are delivered;
//   kDuplicate  it is delivered twice (the second copy waits for a later receive of the same
//               source and tag: the same message of the next collective);
//   kReorder    it is held back and delivered after the rank's next operation (another send,
//               a receive posted or waited for, an all-reduce), so later messages overtake it;
//   kBitFlip    bit `bit` (modulo its size in bits) of the delivered copy is flipped;
//   kDelay      the rank stalls `delay` before posting it (a slow or paused peer);
//   kClose      the rank's connection closes at this send: it and every later operation of
//               the rank raise TransportError (what a rank sees when its connection resets).
//
// Sends are counted per rank over point-to-point messages only (both parts of a two-part
// message count), from 0, across collectives. The header exchange (allreduce_sum_i64) is
// not a message here; with `header_after` >= 0 the rank's n-th all-reduce is faulted instead
// (kDrop: the rank never joins it, which peers see as a timeout; kBitFlip: bit `bit` of its
// contribution is flipped; kClose: as above).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hook/transport/transport.h"

namespace dynamiq {

enum class FaultKind : uint8_t { kNone, kDrop, kTruncate, kDuplicate, kReorder, kBitFlip, kDelay, kClose };
const char* fault_name(FaultKind k);

struct FaultSpec {
  FaultKind kind = FaultKind::kNone;
  int rank = 0;              // the rank whose operation is faulted
  int64_t message = 0;       // which of its point-to-point sends (0-based)
  int64_t header_after = -1; // >= 0: fault its all-reduce number `header_after` instead
  int64_t bit = 0;           // kBitFlip
  size_t keep_bytes = 0;     // kTruncate
  std::chrono::milliseconds delay{0};  // kDelay
};

class FaultTransport final : public Transport {
 public:
  FaultTransport(Transport& inner, const FaultSpec& spec);
  ~FaultTransport() override;
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override;
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override;
  void group_start() override;
  void group_end() override;
  bool posts_in_order() const override { return inner_.posts_in_order(); }
  bool accepts_shorter_messages() const override { return inner_.accepts_shorter_messages(); }
  void allreduce_sum_i64(int64_t* data, size_t count) override;

  // Point-to-point sends this rank has posted so far (faulted or not).
  int64_t sends() const { return sends_; }
  // True once the fault has been applied (for tests: the chosen message existed).
  bool fired() const { return fired_; }
  // Size of the faulted message (0 before it fired, or for a header fault).
  size_t faulted_bytes() const { return faulted_bytes_; }

 private:
  void before_op();  // delivers a held (reordered) message; raises after a close
  std::unique_ptr<Request> post_copy(const std::vector<uint8_t>& bytes, int dst, uint32_t tag);

  Transport& inner_;
  const FaultSpec spec_;
  const bool mine_;
  int64_t sends_ = 0;
  int64_t allreduces_ = 0;
  bool fired_ = false;
  bool closed_ = false;
  size_t faulted_bytes_ = 0;
  // kReorder: the held message and where it goes
  bool holding_ = false;
  std::vector<uint8_t> held_;
  int held_dst_ = 0;
  uint32_t held_tag_ = 0;
  // copies whose sends are in flight (the inner transport may read them until completion)
  std::vector<std::shared_ptr<std::vector<uint8_t>>> copies_;
  std::vector<std::unique_ptr<Request>> internal_;  // requests of sends the caller never sees
};

}  // namespace dynamiq
