// An in-process transport: n ranks as threads sharing one InprocWorld.
// Sends are eager (the bytes are copied into the receiver's mailbox at once),
// receives block until a message with the same (source, tag) arrives and
// must have exactly the posted size (or at most it, as on Gloo: see
// set_accepts_shorter_messages). With set_rendezvous_sends, sends behave as
// Gloo's instead (see there). If any rank fails, the world is marked
// failed and every blocked peer raises at once instead of waiting out the
// timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/codec.h"
#include "hook/transport/transport.h"

namespace dynamiq {

class InprocWorld {
 public:
  // `memory`: where the ranks' send and receive buffers live (null: host);
  // messages are staged on the host through its to_host / from_host.
  explicit InprocWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(120),
                       const Memory* memory = nullptr);
  int size() const { return size_; }

  // Runs fn(rank, transport) on `size` threads and rethrows the first failure
  // (the lowest rank's exception if several failed).
  void run(const std::function<void(int, Transport&)>& fn);

  // Marks the world failed: blocked receives and reductions raise.
  void fail(int rank, const std::string& why);

  // NCCL's ordering rule, checked on what the ranks posted (call after run):
  // ProcessGroupNCCL runs all point-to-point operations between two ranks on
  // one communicator and stream, in posting order, so the k-th operation rank
  // a posts towards b must be a send when b's k-th towards a is a receive (and
  // the other way round) of the same size; operations posted inside one
  // group_start/group_end count as one unit matched as a whole. Two sends or two
  // receives facing each other would wait for ever on NCCL (Gloo buffers and
  // does not mind). Returns one line per pair of ranks that breaks the rule
  // (its first offending position), empty when every pair follows it.
  std::vector<std::string> nccl_order_violations() const;
  // NCCL's other execution model, checked on what the ranks posted (call after
  // run): every operation of a rank on ONE stream, in posting order. That is
  // how ProcessGroupNCCL runs point-to-point operations inside
  // startCoalescing/endCoalescing (batch_isend_irecv: they go to the group's
  // communicator) and, in newer torch, every point-to-point operation of a
  // group initialised eagerly (init_process_group(device_id=...)). A unit (one
  // operation outside a group, or one group) starts when the rank's previous
  // unit has finished; each of its operations finishes when its partner runs
  // in the partner's current unit (the k-th send from a to b meets b's k-th
  // receive from a; a large NCCL send does not finish before its receive runs);
  // all-reduces (the header exchange) need every rank at its matching one.
  // Returns "" when every rank's posting runs to the end, else what blocks
  // (mismatched sizes, or a deadlock with every stuck rank's current unit) or
  // what would be delivered wrongly (a send meeting, in posting order, a
  // receive posted for another message: another tag).
  std::string nccl_stream_deadlock() const;
  // The same model's latency: rounds until the last rank's last unit has
  // finished, where an operation takes one round from the moment both its
  // ends run it (an all-reduce: every rank) and a unit ends with its last
  // operation. So a ring's 2(n-1) steps are 2(n-1) rounds, blocks included
  // (one unit each), whatever the bytes. -1 when the posting deadlocks.
  int64_t nccl_stream_rounds() const;
  // Makes the ranks' transports report posts_in_order() (as an NCCL
  // transport does), so the executor posts for NCCL. Call before run().
  void set_posts_in_order(bool on) { posts_in_order_ = on; }
  bool posts_in_order() const { return posts_in_order_; }
  // Lets a message complete a receive posted for more bytes (Gloo does), and
  // makes the ranks' transports report accepts_shorter_messages(). Call
  // before run().
  void set_accepts_shorter_messages(bool on) { accepts_shorter_ = on; }
  bool accepts_shorter_messages() const { return accepts_shorter_; }
  // Gloo's send semantics: a message moves only once both its send and its
  // receive are posted (whichever comes second copies the bytes, straight from
  // the sender's buffer into the receiver's), and a send completes then; its
  // Request's test() stays false until wait() (Gloo's SendWork reports
  // completion only from wait()). A sender that frees or rewrites its buffer
  // before the send completes is caught (wrong bytes, or ASan), and so is a
  // rank that waits on a send whose receive is never posted (deadlock: the
  // timeout). Call before run().
  void set_rendezvous_sends(bool on) { rendezvous_ = on; }
  bool rendezvous_sends() const { return rendezvous_; }
  // Messages sent so far (all ranks).
  int64_t messages_posted() const;

  // -- used by InprocTransport --
  // Records a posted operation for nccl_order_violations (group 0: none).
  // peer -1: an all-reduce.
  void record(int rank, int peer, bool send, size_t bytes, uint64_t group, uint32_t tag = 0);
  void post(int src, int dst, uint32_t tag, const void* data, size_t bytes);
  void take(int src, int dst, uint32_t tag, void* data, size_t bytes);
  // Rendezvous mode: one message's state, shared by its send and receive.
  struct Transfer {
    bool done = false;
    std::string error;  // set with done when the sizes do not fit
  };
  std::shared_ptr<Transfer> post_send_rv(int src, int dst, uint32_t tag, const void* data, size_t bytes);
  std::shared_ptr<Transfer> post_recv_rv(int src, int dst, uint32_t tag, void* data, size_t bytes);
  void wait_rv(const Transfer& t, const char* what, int peer, uint32_t tag);
  void allreduce(int rank, int64_t* data, size_t count);

 private:
  using Key = std::tuple<int, int, uint32_t>;  // src, dst, tag
  void throw_if_failed_locked() const;
  std::string simulate_stream(int64_t* rounds) const;

  const int size_;
  const std::chrono::milliseconds timeout_;
  const Memory& memory_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::deque<std::vector<uint8_t>>> mail_;
  // rendezvous mode: posted sends and receives not yet matched, per (src, dst, tag)
  struct Side {
    const void* send = nullptr;
    void* recv = nullptr;
    size_t bytes = 0;
    std::shared_ptr<Transfer> t;
  };
  std::map<Key, std::deque<Side>> unmatched_sends_, unmatched_recvs_;
  void move_locked(const Side& s, const Side& r);
  bool rendezvous_ = false;
  bool failed_ = false;
  std::string failure_;
  // all-reduce rendezvous
  uint64_t ar_generation_ = 0;
  int ar_arrived_ = 0;
  std::vector<int64_t> ar_sum_;
  std::vector<int64_t> ar_result_;
  // posted operations per (rank, peer), for nccl_order_violations
  struct Posted {
    bool send;
    size_t bytes;
    uint64_t group;
  };
  std::map<std::pair<int, int>, std::vector<Posted>> posted_;
  // every rank's posts in order, for nccl_stream_deadlock
  struct Seq {
    int peer;  // -1: all-reduce
    bool send;
    size_t bytes;
    uint64_t group;
    uint32_t tag;  // what the message is (NCCL ignores it; the checker compares it)
  };
  std::vector<std::vector<Seq>> seq_;
  bool posts_in_order_ = false;
  bool accepts_shorter_ = false;
  int64_t messages_posted_ = 0;
};

class InprocTransport final : public Transport {
 public:
  InprocTransport(InprocWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t tag) override;
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t tag) override;
  void allreduce_sum_i64(int64_t* data, size_t count) override;
  void group_start() override;
  void group_end() override;
  bool posts_in_order() const override { return world_.posts_in_order(); }
  bool accepts_shorter_messages() const override { return world_.accepts_shorter_messages(); }

 private:
  InprocWorld& world_;
  const int rank_;
  int group_depth_ = 0;
  uint64_t group_ = 0;        // current group id (0: outside any group)
  uint64_t next_group_ = 0;
};

}  // namespace dynamiq
