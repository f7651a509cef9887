#include "hook/collective/executor.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <vector>

#include "hook/collective/exec_env.h"
#include "hook/collective/recv_window.h"
#include "hook/collective/send_window.h"

namespace dynamiq {
namespace {

// The float accumulator of the blocks that receive a kRecvDA, laid out in wire
// order over the wire positions those blocks span. From the pool too: a
// device's allocation per collective would cost a cudaMalloc and a
// synchronising cudaFree every time.
class Accumulator {
 public:
  explicit Accumulator(const ExecEnv& env)
      : bucket_(env.args.bucket), unit_(env.plan.unit), held_(env.bt.blocks.size(), 0) {
    for (const Op& op : env.prog.ops) {
      if (op.role != Role::kRecvDA) continue;
      w0_ = std::min(w0_, env.block(op).w0);
      w1_ = std::max(w1_, env.block(op).w1);
    }
    if (w1_ > w0_) buf_ = env.pool.get(size_t((w1_ - w0_) * unit_) * sizeof(float));
    data_ = buf_ ? reinterpret_cast<float*>(buf_->data()) : nullptr;
  }

  // Where a block's partial value lives: here once a kRecvDA has added into
  // it (mark_held), else in the bucket.
  Local local_of(int32_t block) const {
    Local x;
    if (held_[size_t(block)]) {
      x.acc = data_;
      x.acc_w0 = w0_;
    } else {
      x.bucket = bucket_;
    }
    return x;
  }
  // Where a kRecvDA of block b writes.
  float* slot(const Block& b) const { return data_ + (b.w0 - w0_) * unit_; }
  void mark_held(int32_t block) { held_[size_t(block)] = 1; }

 private:
  const void* bucket_;
  int64_t unit_;
  int64_t w0_ = INT64_MAX, w1_ = INT64_MIN;
  BufferPool::Ptr buf_;
  float* data_ = nullptr;
  std::vector<uint8_t> held_;  // per block
};

// The second part of a two-part message, posted later than its first part.
struct SecondPart {
  Op op;
  BufferPool::Ptr buf;
};

// A joined group (Op::group_next) being posted, on an ordered transport: the
// second parts of its two-part messages go together in one more group, once
// every first part it receives has told its size (or at once when it
// receives nothing), so that a group meets its peers' groups as a whole.
struct JoinedGroup {
  std::vector<SecondPart> second_parts;  // sends
  size_t recvs = 0;
  bool second_parts_posted = false;
};

// Per block: the last op index touching its final bytes, to release them early.
std::vector<size_t> last_final_uses(const ExecEnv& env) {
  std::vector<size_t> last(env.bt.blocks.size(), 0);
  for (size_t i = 0; i < env.prog.ops.size(); ++i) {
    const Role r = env.op(i).role;
    if (r == Role::kSendFinal || r == Role::kRecvFinal || r == Role::kRecvSink || r == Role::kLocalSink ||
        r == Role::kLocalFinal)
      last[size_t(env.op(i).block)] = i;
  }
  return last;
}

// ExecArgs::send_ahead's default. Netbed, 1 Gbit/s, 64 MB, dynamiq 5 bits
// ring, 2-core guest at load average 5 (experiments/results/overlap): none /
// 2 ahead, 2 ranks 239 / 151 ms, 4 ranks (2 per core) 298 / 255 ms. (Before
// sends waited for a missing message only, 2 ahead made 4 ranks on 2 loaded
// cores 18-23 % slower.)
int default_send_ahead() { return 2; }

int send_ahead_limit(const ExecEnv& env) {
  if (env.ordered) return 0;  // posting order is matching order there
  if (env.args.send_ahead >= 0) return env.args.send_ahead;
  const char* v = std::getenv("DYNAMIQ_SEND_AHEAD");
  return v && *v ? std::max(0, std::atoi(v)) : default_send_ahead();
}

bool any_two_part(const ExecEnv& env) {
  for (const Block& b : env.bt.blocks)
    if (env.codec.max_dynamic_bytes(env.plan, b) > 0) return true;
  return false;
}

// One execute(): walks the program one op at a time (run_op).
class Executor {
 public:
  explicit Executor(ExecEnv& env);
  void run();

 private:
  void run_op(size_t i);
  void release_finals(size_t i);

  // sends
  void send(size_t i, size_t recvs_upto);
  void send_ahead(size_t i);
  BufferPool::Ptr message_to_send(const Op& op);
  void post_send(size_t i, const BufferPool::Ptr& buf);
  void post_both_parts(const Op& op, const BufferPool::Ptr& buf, size_t static_bytes);
  void post_send_view(size_t i, const uint8_t* data);
  bool paired_recv(size_t i) const;
  template <class F>
  void post_with_paired_recv(size_t i, F&& post_send);

  // joined groups (ordered transports)
  bool starts_joined_group(size_t i) const;
  void post_joined_group(size_t first);
  void post_second_parts(JoinedGroup& g);
  void wait_joined_first_parts(size_t i);

  // receives and local ops
  void receive(size_t i);
  void wait_whole_message(size_t i, PostedRecv& pr);
  void consume(const Op& op, const BufferPool::Ptr& msg);
  void reduce_and_recompress(const Op& op, const BufferPool::Ptr& msg);
  void take_final(const Op& op, const BufferPool::Ptr& msg);
  void local_sink(const Op& op);
  void local_final(const Op& op);

  ExecEnv& env_;
  const Codec& codec_;
  const Plan& plan_;
  Accumulator acc_;
  std::vector<BufferPool::Ptr> pending_;  // per block: what a kRecvDAR made, for its kSendPending
  std::vector<BufferPool::Ptr> finals_;   // per block: final bytes, kept for the all-gather
  const std::vector<size_t> last_final_use_;
  ReceiveWindow recvs_;
  SendWindow sends_;
  // Ordered transports only: the second part of a two-part message sent in a
  // step that also receives, posted in one group with the receive of the
  // incoming message's second part (op index of that receive -> the part),
  // once the incoming first part told its size.
  std::map<size_t, SecondPart> deferred_;
  std::vector<JoinedGroup> joined_;
  std::vector<int32_t> joined_of_;         // receive op -> its joined group (-1: none)
  JoinedGroup* posting_joined_ = nullptr;  // the joined group being posted
  std::vector<uint8_t> posted_with_group_;  // ops posted ahead with their joined group
  const bool two_part_;                     // any message with a second part (lossless)
  // send_ahead: its limit, the ops posted ahead, how many of them the walk has not reached
  const int send_ahead_limit_;
  std::vector<uint8_t> sent_ahead_;
  int ahead_ = 0;
  std::vector<uint8_t> busy_;  // send_ahead's scratch: blocks with a receive or local op before the send
};

Executor::Executor(ExecEnv& env)
    : env_(env),
      codec_(env.codec),
      plan_(env.plan),
      acc_(env),
      pending_(env.bt.blocks.size()),
      finals_(env.bt.blocks.size()),
      last_final_use_(last_final_uses(env)),
      recvs_(env),
      sends_(env),
      joined_of_(env.prog.ops.size(), -1),
      posted_with_group_(env.prog.ops.size(), 0),
      two_part_(any_two_part(env)),
      send_ahead_limit_(send_ahead_limit(env)),
      sent_ahead_(send_ahead_limit_ > 0 ? env.prog.ops.size() : 0, 0) {}

void Executor::run() {
  try {
    for (size_t i = 0; i < env_.prog.ops.size(); ++i) {
      if (starts_joined_group(i)) post_joined_group(i);
      run_op(i);
      release_finals(i);
      // Completed sends give their buffers back to the pool now, for the next
      // messages to reuse; at most a window of send buffers stays in flight.
      if (!sends_.empty()) sends_.reap(i);
    }
    sends_.wait_all();
  } catch (...) {
    // Requests may still reference buffers (a posted receive can be written
    // by the backend later): park them forever rather than free memory a
    // backend might still write; the process group is unusable after a failure.
    recvs_.park();
    sends_.park();
    park_thread_buffer_pool(env_.memory);
    throw;
  }
}

// One op, by its role (a new role is a case here or in consume).
void Executor::run_op(size_t i) {
  const Op& op = env_.op(i);
  if (is_recv(op.role))
    receive(i);
  else if (op.role == Role::kLocalSink)
    local_sink(op);
  else if (op.role == Role::kLocalFinal)
    local_final(op);
  else if (!sent_ahead_.empty() && sent_ahead_[i])
    --ahead_;
  else if (!posted_with_group_[i])
    send(i, i);
}

void Executor::release_finals(size_t i) {
  const size_t block = size_t(env_.op(i).block);
  if (last_final_use_[block] == i) finals_[block].reset();
}

// ---- sends -----------------------------------------------------------------------

// A send: receives due soon are posted first (netbed study: with two ranks, a
// send posted before its peer's receive often serialises on Gloo): every one
// up to op `recvs_upto` (the op itself, or for a send posted ahead the walk's
// current op), more within the window.
void Executor::send(size_t i, size_t recvs_upto) {
  const Op& op = env_.op(i);
  recvs_.post_upto(recvs_upto);
  const uint8_t* view =
      op.role == Role::kSendLeaf ? codec_.wire_view(acc_.local_of(op.block), plan_, env_.block(op)) : nullptr;
  if (view)
    post_send_view(i, view);
  else
    post_send(i, message_to_send(op));
}

// The bytes a send op sends: a leaf's compressed now, a kSendPending's made by
// the block's kRecvDAR, a kSendFinal's the block's final bytes.
BufferPool::Ptr Executor::message_to_send(const Op& op) {
  const Block& b = env_.block(op);
  if (op.role == Role::kSendLeaf) {
    BufferPool::Ptr buf = env_.pool.get(env_.max_message_bytes(b));
    env_.timer.kernel("compress", env_.index_of(op), op.block,
                      [&] { buf->size = codec_.compress(acc_.local_of(op.block), plan_, b, env_.args.rng, buf->data()); });
    return buf;
  }
  if (op.role == Role::kSendPending) {
    BufferPool::Ptr buf = std::move(pending_[size_t(op.block)]);
    DQ_CHECK(buf, "executor: pending bytes missing (schedule bug)");
    return buf;
  }
  DQ_CHECK(finals_[size_t(op.block)], "executor: final bytes missing (schedule bug)");
  return finals_[size_t(op.block)];
}

// Posts op i's message as the transport takes it:
//  - as one message (the receiver posted for its largest size);
//  - in a joined group being posted: the first part now (with the step's
//    receive), the second part with the group's (post_second_parts);
//  - a step that only sends: both parts now, in one group (Gloo: no
//    constraint), or on an ordered transport one after the other, as the
//    receiver posts them;
//  - a step that also receives: the first parts together now, the second
//    parts together later (deferred_, wait_whole_message).
void Executor::post_send(size_t i, const BufferPool::Ptr& buf) {
  const Op& op = env_.op(i);
  const size_t sb = env_.static_bytes(op);
  DQ_CHECK(buf->size >= sb, "codec produced fewer bytes than its static part");
  if (env_.one_part(env_.block(op))) {
    sends_.send_whole(op, buf);
  } else if (posting_joined_) {
    post_with_paired_recv(i, [&] {
      sends_.send_static_part(op, buf, sb);
      if (buf->size > sb) posting_joined_->second_parts.push_back({op, buf});
    });
  } else if (!paired_recv(i)) {
    post_both_parts(op, buf, sb);
  } else {
    post_with_paired_recv(i, [&] {
      sends_.send_static_part(op, buf, sb);
      deferred_.emplace(recvs_.next(), SecondPart{op, buf});
    });
  }
  env_.st.bytes_sent += int64_t(buf->size);
  env_.st.messages_sent += 1;
}

void Executor::post_both_parts(const Op& op, const BufferPool::Ptr& buf, size_t static_bytes) {
  if (!env_.ordered) env_.tr.group_start();
  sends_.send_static_part(op, buf, static_bytes);
  sends_.send_dynamic_part(op, buf, static_bytes);
  if (!env_.ordered) env_.tr.group_end();
}

// A zero-copy send straight from the bucket (Codec::wire_view).
void Executor::post_send_view(size_t i, const uint8_t* data) {
  const Op& op = env_.op(i);
  const size_t sb = env_.static_bytes(op);
  post_with_paired_recv(i, [&] { sends_.send_view(op, data, sb); });
  env_.st.bytes_sent += int64_t(sb);
  env_.st.messages_sent += 1;
}

// The receive posted in one group with the send of op i (ordered
// transports): the receive of the same step (Op::with_recv), so that every
// rank's k-th step runs against its peers' k-th step.
bool Executor::paired_recv(size_t i) const {
  if (!env_.ordered || !env_.op(i).with_recv) return false;
  DQ_CHECK(i + 1 < env_.prog.ops.size() && is_recv(env_.op(i + 1).role) && recvs_.next() == i + 1,
           "executor: a step's send is not followed by its receive (schedule bug)");
  return true;
}

// Runs post_send(), in one group with the step's receive where it has one.
template <class F>
void Executor::post_with_paired_recv(size_t i, F&& post_send) {
  const bool paired = paired_recv(i);
  if (paired) env_.tr.group_start();
  post_send();
  if (paired) {
    recvs_.post_next();
    env_.tr.group_end();
  }
}

// ---- joined groups (Op::group_next; ordered transports) --------------------------

bool Executor::starts_joined_group(size_t i) const {
  return env_.ordered && env_.op(i).group_next && !posted_with_group_[i];
}

// Every send of the group is made and posted, and every receive posted,
// before the group closes; then the ops run in program order as usual (the
// sends are not posted again).
void Executor::post_joined_group(size_t first) {
  joined_.emplace_back();
  posting_joined_ = &joined_.back();
  env_.tr.group_start();
  for (size_t s = first;; ++s) {
    const Op& op = env_.op(s);
    posted_with_group_[s] = 1;
    if (is_send(op.role)) {
      send(s, s);
    } else if (is_recv(op.role)) {
      recvs_.post_upto(s);
      if (two_part_) {
        joined_of_[s] = int32_t(joined_.size() - 1);
        posting_joined_->recvs += 1;
      }
    }
    if (!op.group_next) break;
  }
  env_.tr.group_end();
  posting_joined_ = nullptr;
  JoinedGroup& g = joined_.back();
  if (g.recvs == 0 && !g.second_parts.empty()) post_second_parts(g);
}

void Executor::post_second_parts(JoinedGroup& g) {
  env_.tr.group_start();
  for (const SecondPart& m : g.second_parts) sends_.send_dynamic_part(m.op, m.buf, env_.static_bytes(m.op));
  for (size_t k = 0; k < g.recvs; ++k) recvs_.post_second_part(recvs_.at(k));
  env_.tr.group_end();
  g.second_parts.clear();
  g.second_parts_posted = true;
}

// At the first receive of a joined group: every first part, then the group's
// second parts in one group (the window's oldest receives are exactly its).
void Executor::wait_joined_first_parts(size_t i) {
  const int32_t j = joined_of_[i];
  if (j < 0 || joined_[size_t(j)].second_parts_posted) return;
  JoinedGroup& g = joined_[size_t(j)];
  DQ_CHECK(recvs_.size() >= g.recvs, "executor: joined group's receives missing");
  for (size_t k = 0; k < g.recvs; ++k) {
    DQ_CHECK(joined_of_[recvs_.at(k).op] == j, "executor: joined group's receives out of order");
    recvs_.wait_first_part(recvs_.at(k));
  }
  post_second_parts(g);
}

// ---- receives and local ops ------------------------------------------------------

// Before the walk waits for receive op i (whose message has not arrived):
// posts later sends ahead, in program
// order, at most send_ahead_limit_ not yet reached at a time and within the
// send window. A send may go once no receive or local op on its block lies
// between op i (included) and it: its bytes are then what they would be at its
// own turn (a leaf's local values, a pending or final message made earlier),
// and a later send of a block waits behind an earlier one that must. Blocks
// only ever touch their own bytes, so the results and the messages do not
// change, only when they are posted. Scans a bounded stretch of the program
// (its step and the next, about): enough to start the all-gather's sends of
// finished blocks while the last reduce steps still arrive.
void Executor::send_ahead(size_t i) {
  if (send_ahead_limit_ <= 0 || ahead_ >= send_ahead_limit_) return;
  const size_t end = std::min(env_.prog.ops.size(), i + 4 * size_t(env_.bt.blocks_per_chunk) + 16);
  busy_.assign(env_.bt.blocks.size(), 0);
  for (size_t j = i; j < end && ahead_ < send_ahead_limit_; ++j) {
    const Op& op = env_.op(j);
    const size_t b = size_t(op.block);
    if (!is_send(op.role)) {
      busy_[b] = 1;
      continue;
    }
    if (busy_[b] || sent_ahead_[j] || posted_with_group_[j]) continue;
    if (sends_.held_bytes() + env_.max_message_bytes(env_.block(op)) > size_t(env_.args.window_bytes)) break;
    send(j, i);
    sent_ahead_[j] = 1;
    ++ahead_;
  }
}

void Executor::receive(size_t i) {
  recvs_.post_upto(i);
  recvs_.expect_front(i);
  // only when the message is not there yet: one that has arrived is reduced
  // first, since the next hop waits for what that makes
  if (!sent_ahead_.empty() && !recvs_.at(0).req->test()) send_ahead(i);
  wait_joined_first_parts(i);
  PostedRecv pr = recvs_.pop_front();
  wait_whole_message(i, pr);
  consume(env_.op(i), pr.buf);
}

// Waits for receive op i's first part, then for its second part (posted now,
// unless its joined group posted it), in one group with this step's own
// second part where that waited for this receive (deferred_).
void Executor::wait_whole_message(size_t i, PostedRecv& pr) {
  recvs_.wait_first_part(pr);
  const auto deferred = deferred_.find(i);
  const bool paired = deferred != deferred_.end();
  if (paired) {
    env_.tr.group_start();
    const SecondPart& mine = deferred->second;
    sends_.send_dynamic_part(mine.op, mine.buf, env_.static_bytes(mine.op));
  }
  if (joined_of_[i] < 0) recvs_.post_second_part(pr);
  if (paired) {
    env_.tr.group_end();
    deferred_.erase(deferred);
  }
  recvs_.wait_second_part(pr);
  pr.buf->size = pr.static_bytes + pr.dyn;
  env_.st.bytes_received += int64_t(pr.buf->size);
}

// A received message, by its op's role.
void Executor::consume(const Op& op, const BufferPool::Ptr& msg) {
  const Block& b = env_.block(op);
  switch (op.role) {
    case Role::kRecvDA:  // acc <- local + decompress(msg)
      env_.timer.kernel("decompress-accumulate", env_.index_of(op), op.block, [&] {
        codec_.decompress_accumulate(msg->data(), msg->size, acc_.local_of(op.block), plan_, b, acc_.slot(b));
      });
      acc_.mark_held(op.block);
      break;
    case Role::kRecvDAR:
    case Role::kRecvSink: reduce_and_recompress(op, msg); break;
    case Role::kRecvFinal: take_final(op, msg); break;
    default: throw Error("executor: bad receive role");
  }
}

// kRecvDAR: pending <- compress(local + decompress(msg)).
// kRecvSink: final <- the same; output <- decompress(final) (with an output
// view the final bytes are written in place: Codec::output_view); with
// ExecArgs::sink_writes_sum output <- local + decompress(msg), no final bytes.
void Executor::reduce_and_recompress(const Op& op, const BufferPool::Ptr& msg) {
  const Block& b = env_.block(op);
  const bool sink = op.role == Role::kRecvSink;
  if (sink && env_.args.sink_writes_sum) {
    sends_.wait_zero_copy(op.block);
    env_.timer.kernel("sink-sum", env_.index_of(op), op.block, [&] {
      codec_.decompress_accumulate_output(msg->data(), msg->size, acc_.local_of(op.block), plan_, b, env_.args.out);
    });
    return;  // (a kSendFinal of this block would find no final bytes: a schedule bug, checked there)
  }
  uint8_t* view = sink ? codec_.output_view(env_.args.out, plan_, b) : nullptr;
  if (view) sends_.wait_zero_copy(op.block);
  BufferPool::Ptr out = view ? BufferPool::view(view, 0) : env_.pool.get(env_.max_message_bytes(b));
  env_.timer.kernel(sink ? "sink-reduce" : "reduce-recompress", env_.index_of(op), op.block, [&] {
    out->size = codec_.decompress_accumulate_recompress(msg->data(), msg->size, acc_.local_of(op.block), plan_, b,
                                                        env_.args.rng, out->data());
  });
  if (!sink) {
    pending_[size_t(op.block)] = std::move(out);
    return;
  }
  if (!view) sends_.wait_zero_copy(op.block);
  env_.timer.kernel("decompress", env_.index_of(op), op.block,
                    [&] { codec_.decompress(out->data(), out->size, plan_, b, env_.args.out); });
  finals_[size_t(op.block)] = std::move(out);
}

// kRecvFinal: final <- msg; output <- decompress(final) (a message received
// into an output view is already output values: Codec::output_view).
void Executor::take_final(const Op& op, const BufferPool::Ptr& msg) {
  sends_.wait_zero_copy(op.block);
  if (!msg->ext)
    env_.timer.kernel("decompress", env_.index_of(op), op.block,
                      [&] { codec_.decompress(msg->data(), msg->size, plan_, env_.block(op), env_.args.out); });
  finals_[size_t(op.block)] = msg;
}

// kLocalSink: final <- compress(local); output <- decompress(final).
void Executor::local_sink(const Op& op) {
  const Block& b = env_.block(op);
  BufferPool::Ptr out = env_.pool.get(env_.max_message_bytes(b));
  sends_.wait_zero_copy(op.block);
  env_.timer.kernel("local-sink", env_.index_of(op), op.block, [&] {
    out->size = codec_.compress(acc_.local_of(op.block), plan_, b, env_.args.rng, out->data());
    codec_.decompress(out->data(), out->size, plan_, b, env_.args.out);
  });
  finals_[size_t(op.block)] = std::move(out);
}

// kLocalFinal (all-gather: the rank's own shard): final <- compress(local),
// the output left alone (it holds those values). With a wire view (identity
// codec) the final bytes are the bucket's own memory, sent without a copy;
// nothing writes there during the collective.
void Executor::local_final(const Op& op) {
  const Block& b = env_.block(op);
  const Local x = acc_.local_of(op.block);
  if (const uint8_t* view = codec_.wire_view(x, plan_, b)) {
    finals_[size_t(op.block)] = BufferPool::view(const_cast<uint8_t*>(view), env_.static_bytes(op));
    return;
  }
  BufferPool::Ptr out = env_.pool.get(env_.max_message_bytes(b));
  env_.timer.kernel("local-final", env_.index_of(op), op.block,
                    [&] { out->size = codec_.compress(x, plan_, b, env_.args.rng, out->data()); });
  finals_[size_t(op.block)] = std::move(out);
}

}  // namespace

void execute(Transport& tr, const Codec& codec, const Plan& plan, const BlockTable& bt, const Program& prog,
             const ExecArgs& args, ExecStats& st) {
  const Memory& memory = args.memory ? *args.memory : host_memory();
  const PoolCall call(memory);  // declared first: ends after every buffer below is back
  std::optional<TimelineRecorder> recorder;
  if (args.timeline) recorder.emplace(*args.timeline, args.timeline_slice, args.timeline_part);
  ExecEnv env(tr, codec, plan, bt, prog, args, memory, call.pool(), st, recorder ? &*recorder : nullptr);
  Executor executor(env);
  try {
    executor.run();
  } catch (...) {
    try {
      codec.finish();  // clears what the failed run left deferred
    } catch (...) {
    }
    throw;
  }
  codec.finish();  // a device codec's deferred checks: one host wait, not one per decode
  if (recorder) recorder->finish();
}

}  // namespace dynamiq
