#include "hook/collective/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace dynamiq {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Frees a pool buffer into the Memory it came from.
struct ReleaseTo {
  const Memory* memory = nullptr;
  void operator()(uint8_t* p) const { memory->release(p); }
};

// Reusable byte buffers. Block messages are all about the same size, and a
// fresh allocation per message costs an mmap, page faults and munmap (on a
// 16 MB fp32 bucket that was slower than the transfer itself), so buffers
// live in a per-thread pool per Memory that persists across collectives (each
// group's collectives run on one worker thread). Memory is not zero-filled.
//
// What it keeps: after each collective, at most the largest number of bytes
// any of the last kPeakWindow collectives had in use at once (and never more
// than kMaxRetained). A collective holds about its rank's share of the bucket
// (final bytes kept for the all-gather) plus the receive window, and DDP's
// first step all-reduces the whole model as one bucket: without the window the
// pool would keep that step's working set for the rest of the job.
class BufferPool {
 public:
  struct Buf {
    std::unique_ptr<uint8_t, ReleaseTo> mem;
    size_t capacity = 0;
    size_t requested = 0;  // what the current user asked for (<= capacity)
    size_t size = 0;  // bytes in use
    uint8_t* ext = nullptr;  // set: a view of memory the pool does not own (the bucket)
    uint8_t* data() { return ext ? ext : mem.get(); }
  };
  using Ptr = std::shared_ptr<Buf>;

  explicit BufferPool(const Memory& memory) : memory_(memory) {}

  // A buffer over caller memory (zero-copy into/out of the bucket).
  static Ptr view(uint8_t* p, size_t size) {
    auto* b = new Buf();
    b->ext = p;
    b->size = size;
    return Ptr(b);
  }

  Ptr get(size_t capacity) {
    std::unique_ptr<Buf> b;
    // Best fit: the smallest free buffer that is large enough.
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i]->capacity >= capacity &&
          (best == free_.size() || free_[i]->capacity < free_[best]->capacity))
        best = i;
    if (best < free_.size()) {
      b = std::move(free_[best]);
      free_[best] = std::move(free_.back());
      free_.pop_back();
      retained_ -= b->capacity;
    } else {
      b = std::make_unique<Buf>();
      b->mem = std::unique_ptr<uint8_t, ReleaseTo>(static_cast<uint8_t*>(memory_.allocate(capacity)),
                                                   ReleaseTo{&memory_});
      b->capacity = capacity;
    }
    b->size = 0;
    b->requested = capacity;
    in_use_ += b->capacity;
    requested_ += capacity;
    call_peak_ = std::max(call_peak_, requested_);
    return Ptr(b.release(), [this](Buf* p) { put(p); });
  }

  // Around each collective (see the class comment).
  // Peaks count requested bytes, not the capacity of the buffers handed out: a
  // small request served by a large free buffer must not keep that buffer alive.
  void begin_call() { call_peak_ = requested_; }
  void end_call() {
    peaks_[next_peak_++ % kPeakWindow] = call_peak_;
    size_t keep = 0;
    for (size_t p : peaks_) keep = std::max(keep, p);
    keep = keep > in_use_ ? keep - in_use_ : 0;
    // largest first (they are the ones a smaller working set does not need), and
    // not below `keep`
    std::sort(free_.begin(), free_.end(), [](const auto& a, const auto& b) { return a->capacity > b->capacity; });
    bool freed = false;
    while (!free_.empty() && retained_ - free_.front()->capacity >= keep) {
      retained_ -= free_.front()->capacity;
      free_.erase(free_.begin());
      freed = true;
    }
    if (freed) memory_.trim();  // a device pool keeps freed memory until told
  }
  size_t bytes() const { return retained_ + in_use_; }

 private:
  void put(Buf* p) {
    std::unique_ptr<Buf> b(p);
    in_use_ -= b->capacity;
    requested_ -= b->requested;
    if (retained_ + b->capacity > kMaxRetained) {  // freed
      b.reset();
      memory_.trim();
      return;
    }
    retained_ += b->capacity;
    free_.push_back(std::move(b));
  }
  static constexpr size_t kMaxRetained = size_t(1) << 30;
  static constexpr size_t kPeakWindow = 16;
  const Memory& memory_;
  std::vector<std::unique_ptr<Buf>> free_;
  size_t retained_ = 0;  // bytes in free_
  size_t in_use_ = 0;    // bytes handed out and not yet back
  size_t requested_ = 0;  // what their users asked for
  size_t call_peak_ = 0;
  std::array<size_t, kPeakWindow> peaks_{};
  size_t next_peak_ = 0;
};

// The calling thread's pool for `memory` (freed when the thread exits);
// replaced after a failure, when the old one is parked (see park_on_failure).
std::unique_ptr<BufferPool>& thread_pool_slot(const Memory& memory) {
  thread_local std::map<std::pair<const Memory*, int>, std::unique_ptr<BufferPool>> pools;
  std::unique_ptr<BufferPool>& pool = pools[{&memory, memory.domain()}];
  if (!pool) pool = std::make_unique<BufferPool>(memory);
  return pool;
}

struct PendingSend {
  std::unique_ptr<Request> req;
  BufferPool::Ptr buf;  // keeps the bytes alive until the send completes (null: zero-copy from the bucket)
  int32_t zero_copy_block = -1;
};
size_t held_bytes(const PendingSend& s) { return s.buf ? s.buf->capacity : 0; }

struct PostedRecv {
  size_t op = 0;
  std::unique_ptr<Request> req;
  BufferPool::Ptr buf;
  size_t static_bytes = 0;
  bool one_part = false;  // posted for the whole message (see accepts_shorter_messages)
  // Receives of a joined group with two-part messages (ordered transports):
  // the first part already waited for, the second part's size and receive.
  bool first_part_done = false;
  size_t dyn = 0;
  std::unique_ptr<Request> dreq;
};

// On failure, requests may still reference buffers (a posted receive can be
// written by the backend later). Park them forever rather than free memory a
// backend might still write; the process group is unusable after a failure.
void park_on_failure(const Memory& memory, std::deque<PostedRecv>& recvs, std::vector<PendingSend>& sends) {
  for (auto& r : recvs) {
    keep_forever(r.req.release());
    if (r.dreq) keep_forever(r.dreq.release());
    keep_forever(r.buf);
  }
  for (auto& s : sends) {
    keep_forever(s.req.release());
    keep_forever(s.buf);
  }
  recvs.clear();
  sends.clear();
  // Buffers returned to the pool later must not be reused or freed either:
  // park this thread's pool (kept reachable, never freed) and start a new one.
  keep_forever(thread_pool_slot(memory).release());
  thread_pool_slot(memory) = std::make_unique<BufferPool>(memory);
}

}  // namespace

void keep_forever(std::shared_ptr<void> p) {
  if (!p) return;
  static std::mutex mu;
  static auto* graveyard = new std::vector<std::shared_ptr<void>>();  // never freed
  std::lock_guard<std::mutex> lk(mu);
  graveyard->push_back(std::move(p));
}

size_t executor_pool_bytes(const Memory* memory) {
  return thread_pool_slot(memory ? *memory : host_memory()).get()->bytes();
}

void execute(Transport& tr, const Codec& codec, const Plan& plan, const BlockTable& bt,
             const Program& prog, const ExecArgs& args, ExecStats& st) {
  const size_t nb = bt.blocks.size();
  const int64_t U = plan.unit;
  const Memory& memory = args.memory ? *args.memory : host_memory();

  // Accumulator: needed by blocks that receive a kRecvDA; laid out in wire order.
  int64_t acc_w0 = INT64_MAX, acc_w1 = INT64_MIN;
  for (const Op& op : prog.ops) {
    if (op.role != Role::kRecvDA) continue;
    const Block& b = bt.blocks[size_t(op.block)];
    acc_w0 = std::min(acc_w0, b.w0);
    acc_w1 = std::max(acc_w1, b.w1);
  }
  BufferPool* pool = thread_pool_slot(memory).get();
  // Declared before every local that holds pool buffers, so it runs after they are back.
  struct CallScope {
    const Memory& memory;
    BufferPool* pool;
    ~CallScope() {
      if (thread_pool_slot(memory).get() == pool) pool->end_call();  // not a pool parked on failure
    }
  } call_scope{memory, pool};
  pool->begin_call();
  // from the pool too: a device's allocation per collective would cost a cudaMalloc and a
  // synchronising cudaFree every time
  BufferPool::Ptr acc_buf;
  if (acc_w1 > acc_w0) acc_buf = pool->get(size_t((acc_w1 - acc_w0) * U) * sizeof(float));
  float* const acc_ptr = acc_buf ? reinterpret_cast<float*>(acc_buf->data()) : nullptr;

  // Last op index touching each block's final bytes, to release them early.
  std::vector<size_t> last_final_use(nb, 0);
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const Op& op = prog.ops[i];
    if (op.role == Role::kSendFinal || op.role == Role::kRecvFinal || op.role == Role::kRecvSink ||
        op.role == Role::kLocalSink)
      last_final_use[size_t(op.block)] = i;
  }

  std::vector<uint8_t> in_acc(nb, 0);
  std::vector<BufferPool::Ptr> pending(nb), finals(nb);
  std::deque<PostedRecv> posted;
  std::vector<PendingSend> sends;
  size_t send_held = 0;  // pool bytes held by `sends` (see reap_sends)
  size_t next_recv = 0;      // next op index to consider for posting a receive
  int64_t inflight = 0;      // bytes of posted, unhandled receives

  auto local_of = [&](int32_t block) {
    Local x;
    if (in_acc[size_t(block)]) {
      x.acc = acc_ptr;
      x.acc_w0 = acc_w0;
    } else {
      x.bucket = args.bucket;
    }
    return x;
  };
  auto timed = [](double& total, auto&& fn) {
    auto t0 = Clock::now();
    fn();
    total += secs(t0, Clock::now());
  };
  auto kernel_timer = [&](auto&& fn) { timed(st.t_kernel, fn); };
  auto wait_timer = [&](Request& r) { timed(st.t_wait, [&] { r.wait(); }); };
  // Transports that run operations in posting order (NCCL: no tags; one
  // stream per rank, or per pair of ranks) get receives in program order only
  // and each step's send and receive in one group (see paired_recv; and the
  // ops a schedule joins with Op::group_next, see JoinedGroup), so the
  // ranks' operations meet in the same order on every rank (InprocWorld's
  // nccl_stream_deadlock and nccl_order_violations check both models). Other
  // transports post receives ahead.
  const bool ordered = tr.posts_in_order();
  // Two-part messages travel as one where the transport allows (Gloo).
  // Both ends of a message decide alike from the block.
  const bool one_part_transport = tr.sends_whole_messages();
  auto one_part = [&](const Block& b) { return one_part_transport && codec.max_dynamic_bytes(plan, b) > 0; };
  auto post_recv_at = [&](size_t idx) {
    const Op& op = prog.ops[idx];
    const Block& b = bt.blocks[size_t(op.block)];
    const size_t sb = codec.static_bytes(plan, b);
    // Final bytes that are the result itself go straight into the bucket. Safe
    // to post early: they can only arrive after this rank's own contribution
    // to the block (read from that same memory) has been delivered.
    uint8_t* view = op.role == Role::kRecvFinal ? codec.output_view(args.out, plan, b) : nullptr;
    auto buf = view ? BufferPool::view(view, 0) : pool->get(codec.max_message_bytes(plan, b));
    PostedRecv pr;
    pr.op = idx;
    pr.static_bytes = sb;
    pr.one_part = one_part(b);
    DQ_CHECK(!(view && pr.one_part), "executor: an output view for a two-part message");
    pr.buf = buf;
    const size_t bytes = pr.one_part ? codec.max_message_bytes(plan, b) : sb;
    timed(st.t_post, [&] { pr.req = tr.irecv(buf->data(), bytes, op.peer, op.tag); });
    inflight += int64_t(buf->capacity);
    posted.push_back(std::move(pr));
  };
  auto post_recvs_upto = [&](size_t must_include) {
    // Post receives in program order until the window is full, but always
    // far enough to include op `must_include`.
    while (next_recv < prog.ops.size()) {
      const Op& op = prog.ops[next_recv];
      if (!is_recv(op.role)) {
        ++next_recv;
        continue;
      }
      if (next_recv > must_include && (ordered || inflight >= args.window_bytes)) break;
      post_recv_at(next_recv);
      ++next_recv;
    }
  };
  // The receive posted in one group with the send of op i (ordered
  // transports): the receive of the same step (Op::with_recv), so that every
  // rank's k-th step runs against its peers' k-th step.
  auto paired_recv = [&](size_t i) {
    if (!ordered || !prog.ops[i].with_recv) return false;
    DQ_CHECK(i + 1 < prog.ops.size() && is_recv(prog.ops[i + 1].role) && next_recv == i + 1,
             "executor: a step's send is not followed by its receive (schedule bug)");
    return true;
  };
  // Blocks whose bucket memory is being sent without a copy: written only after the send completes.
  std::vector<uint8_t> zero_copy_pending(nb, 0);
  // Ordered transports only: the second part of a two-part message sent in a
  // step that also receives, posted in one group with the receive of the
  // incoming message's second part (op index of that receive -> the message),
  // once the incoming first part told its size.
  std::map<size_t, std::pair<Op, BufferPool::Ptr>> deferred_dynamic;
  // A joined group (Op::group_next) being posted, on an ordered transport: the
  // second parts of its two-part messages go together in one more group, once
  // every first part it receives has told its size (or at once when it
  // receives nothing), so that a group meets its peers' groups as a whole.
  struct JoinedGroup {
    std::vector<std::pair<Op, BufferPool::Ptr>> second_parts;  // sends
    size_t recvs = 0;
    bool second_parts_posted = false;
  };
  std::vector<JoinedGroup> joined;
  std::vector<int32_t> joined_of(prog.ops.size(), -1);  // receive op -> its joined group
  JoinedGroup* posting_joined = nullptr;
  auto push_send = [&](PendingSend&& p) {
    send_held += held_bytes(p);
    sends.push_back(std::move(p));
  };
  auto send_dynamic = [&](const Op& op, const BufferPool::Ptr& buf, size_t sb) {
    if (buf->size > sb)
      push_send(PendingSend{
          tr.isend(buf->data() + sb, buf->size - sb, op.peer, op.tag | kDynamicTagBit), buf, -1});
  };
  auto post_send = [&](size_t i, const BufferPool::Ptr& buf) {
    const Op& op = prog.ops[i];
    const Block& b = bt.blocks[size_t(op.block)];
    const size_t sb = codec.static_bytes(plan, b);
    DQ_CHECK(buf->size >= sb, "codec produced fewer bytes than its static part");
    if (one_part(b)) {
      // the whole message at once (the receiver posted for its largest size)
      timed(st.t_post, [&] {
        push_send(PendingSend{tr.isend(buf->data(), buf->size, op.peer, op.tag), buf, -1});
      });
    } else if (posting_joined) {
      // first part now (with the step's receive), second part with the group's
      const bool paired = paired_recv(i);
      if (paired) tr.group_start();
      timed(st.t_post, [&] { push_send(PendingSend{tr.isend(buf->data(), sb, op.peer, op.tag), buf, -1}); });
      if (buf->size > sb) posting_joined->second_parts.emplace_back(op, buf);
      if (paired) {
        post_recv_at(next_recv++);
        tr.group_end();
      }
    } else if (!paired_recv(i)) {
      // both parts now: in one group (Gloo: no constraint), or on an ordered
      // transport one after the other, as the receiver posts them
      if (!ordered) tr.group_start();
      timed(st.t_post, [&] {
        push_send(PendingSend{tr.isend(buf->data(), sb, op.peer, op.tag), buf, -1});
        send_dynamic(op, buf, sb);
      });
      if (!ordered) tr.group_end();
    } else {
      // a step that also receives: first parts together now, second parts together later
      tr.group_start();
      timed(st.t_post, [&] { push_send(PendingSend{tr.isend(buf->data(), sb, op.peer, op.tag), buf, -1}); });
      deferred_dynamic.emplace(next_recv, std::make_pair(op, buf));
      post_recv_at(next_recv++);
      tr.group_end();
    }
    st.bytes_sent += int64_t(buf->size);
    st.messages_sent += 1;
  };
  auto post_send_view = [&](size_t i, const uint8_t* data) {
    const Op& op = prog.ops[i];
    const size_t sb = codec.static_bytes(plan, bt.blocks[size_t(op.block)]);
    const bool paired = paired_recv(i);
    if (paired) tr.group_start();
    timed(st.t_post,
          [&] { push_send(PendingSend{tr.isend(data, sb, op.peer, op.tag), nullptr, op.block}); });
    if (paired) {
      post_recv_at(next_recv++);
      tr.group_end();
    }
    zero_copy_pending[size_t(op.block)] = 1;
    st.bytes_sent += int64_t(sb);
    st.messages_sent += 1;
  };
  // Before a block's part of the bucket is overwritten with results.
  auto before_output = [&](int32_t block) {
    if (!zero_copy_pending[size_t(block)]) return;
    for (auto& s : sends)
      if (s.zero_copy_block == block) {
        wait_timer(*s.req);
        s.zero_copy_block = -1;
      }
    zero_copy_pending[size_t(block)] = 0;
  };
  // Send buffers go back to the pool once their sends complete. Gloo's sends
  // report completion only from wait() (test() stays false), so without a bound
  // a collective would hold every message it sent: its whole share of the
  // bucket. Hence the send window: while the buffers of unfinished sends exceed
  // window_bytes, wait on the oldest. That cannot deadlock: every schedule
  // orders each rank's operations by (step, block), a message has the same
  // position in its sender's and its receiver's program, and receives are
  // posted at least up to the rank's current operation; a rank waiting on a
  // send is waiting for a receiver whose position is earlier than that send's,
  // so a chain of waiting ranks has strictly decreasing positions and cannot
  // close into a cycle. (Checked on every schedule with rendezvous sends in
  // tests/cpp/test_send_window.cc.)
  auto reap_sends = [&] {
    timed(st.t_post, [&] {
      size_t k = 0;
      for (size_t i = 0; i < sends.size(); ++i) {
        if (sends[i].req->test()) {  // completed: drop request and buffer ref
          send_held -= held_bytes(sends[i]);
          continue;
        }
        if (k != i) sends[k] = std::move(sends[i]);
        ++k;
      }
      sends.resize(k);
    });
    for (size_t i = 0; i < sends.size() && send_held > size_t(args.window_bytes);) {
      if (!sends[i].buf) {
        ++i;
        continue;
      }
      wait_timer(*sends[i].req);
      send_held -= held_bytes(sends[i]);
      sends.erase(sends.begin() + std::ptrdiff_t(i));
    }
  };
  // Ops posted ahead with their joined group (Op::group_next; ordered transports).
  std::vector<uint8_t> posted_with_group(prog.ops.size(), 0);
  bool two_part = false;  // any message with a second part (lossless)
  for (const Block& b : bt.blocks) two_part = two_part || codec.max_dynamic_bytes(plan, b) > 0;
  auto post_second_parts = [&](JoinedGroup& g) {
    tr.group_start();
    timed(st.t_post, [&] {
      for (const auto& m : g.second_parts)
        send_dynamic(m.first, m.second, codec.static_bytes(plan, bt.blocks[size_t(m.first.block)]));
      for (size_t k = 0; k < g.recvs; ++k) {
        PostedRecv& r = posted[k];
        const Op& rop = prog.ops[r.op];
        if (r.dyn > 0 && !r.one_part)
          r.dreq = tr.irecv(r.buf->data() + r.static_bytes, r.dyn, rop.peer, rop.tag | kDynamicTagBit);
      }
    });
    tr.group_end();
    g.second_parts.clear();
    g.second_parts_posted = true;
  };
  // Waits for a receive's first part and reads the size of its second part.
  auto first_part = [&](PostedRecv& r) {
    if (r.first_part_done) return;
    wait_timer(*r.req);
    const Block& rb = bt.blocks[size_t(prog.ops[r.op].block)];
    r.dyn = codec.dynamic_bytes(r.buf->data(), plan, rb);
    if (r.dyn > codec.max_dynamic_bytes(plan, rb))
      throw MalformedMessage(codec.name() + ": dynamic part larger than its bound");
    r.first_part_done = true;
  };
  // A send: receives due soon are posted first (see FIELD-NOTES: with two
  // ranks, a send posted before its peer's receive serialises on Gloo).
  auto do_send = [&](size_t i) {
    const Op& op = prog.ops[i];
    const Block& blk = bt.blocks[size_t(op.block)];
    post_recvs_upto(i);
    BufferPool::Ptr buf;
    const uint8_t* view = op.role == Role::kSendLeaf ? codec.wire_view(local_of(op.block), plan, blk) : nullptr;
    if (view) {
      post_send_view(i, view);
    } else if (op.role == Role::kSendLeaf) {
      buf = pool->get(codec.max_message_bytes(plan, blk));
      kernel_timer([&] { buf->size = codec.compress(local_of(op.block), plan, blk, args.rng, buf->data()); });
    } else if (op.role == Role::kSendPending) {
      buf = std::move(pending[size_t(op.block)]);
      DQ_CHECK(buf, "executor: pending bytes missing (schedule bug)");
    } else {
      buf = finals[size_t(op.block)];
      DQ_CHECK(buf, "executor: final bytes missing (schedule bug)");
    }
    if (buf) post_send(i, buf);
  };
  try {
    for (size_t i = 0; i < prog.ops.size(); ++i) {
      const Op& op = prog.ops[i];
      const Block& blk = bt.blocks[size_t(op.block)];
      if (ordered && op.group_next && !posted_with_group[i]) {
        // Ops joined into one group (Op::group_next; ordered transports):
        // every send of the group is made and posted, and every receive
        // posted, before the group closes; then the ops run in program order
        // as usual (the sends are not posted again).
        joined.emplace_back();
        posting_joined = &joined.back();
        tr.group_start();
        for (size_t s = i;; ++s) {
          posted_with_group[s] = 1;
          if (is_send(prog.ops[s].role)) {
            do_send(s);
          } else if (is_recv(prog.ops[s].role)) {
            post_recvs_upto(s);
            if (two_part) {
              joined_of[s] = int32_t(joined.size() - 1);
              posting_joined->recvs += 1;
            }
          }
          if (!prog.ops[s].group_next) break;
        }
        tr.group_end();
        posting_joined = nullptr;
        if (joined.back().recvs == 0 && !joined.back().second_parts.empty()) post_second_parts(joined.back());
      }
      if (is_recv(op.role)) {
        post_recvs_upto(i);
        DQ_CHECK(!posted.empty() && posted.front().op == i, "executor: receive order broken");
        if (joined_of[i] >= 0 && !joined[size_t(joined_of[i])].second_parts_posted) {
          // the first receive of a joined group: every first part, then the
          // group's second parts in one group (posted holds exactly its receives)
          JoinedGroup& g = joined[size_t(joined_of[i])];
          DQ_CHECK(posted.size() >= g.recvs, "executor: joined group's receives missing");
          for (size_t k = 0; k < g.recvs; ++k) {
            DQ_CHECK(joined_of[posted[k].op] == joined_of[i], "executor: joined group's receives out of order");
            first_part(posted[k]);
          }
          post_second_parts(g);
        }
        PostedRecv pr = std::move(posted.front());
        posted.pop_front();
        first_part(pr);
        size_t total = pr.static_bytes;
        const size_t dyn = pr.dyn;
        auto deferred = deferred_dynamic.find(i);
        const bool paired = deferred != deferred_dynamic.end();
        if (paired) {  // our second part in one group with the incoming one's
          tr.group_start();
          const Op& sop = deferred->second.first;
          send_dynamic(sop, deferred->second.second, codec.static_bytes(plan, bt.blocks[size_t(sop.block)]));
        }
        std::unique_ptr<Request> dreq = std::move(pr.dreq);
        if (dyn > 0 && !pr.one_part && joined_of[i] < 0)
          dreq = tr.irecv(pr.buf->data() + total, dyn, op.peer, op.tag | kDynamicTagBit);
        if (paired) {
          tr.group_end();
          deferred_dynamic.erase(deferred);
        }
        if (dreq) wait_timer(*dreq);
        total += dyn;
        pr.buf->size = total;
        st.bytes_received += int64_t(total);
        inflight -= int64_t(pr.buf->capacity);
        const uint8_t* msg = pr.buf->data();
        switch (op.role) {
          case Role::kRecvDA: {
            float* dst = acc_ptr + (blk.w0 - acc_w0) * U;
            kernel_timer([&] { codec.decompress_accumulate(msg, total, local_of(op.block), plan, blk, dst); });
            in_acc[size_t(op.block)] = 1;
            break;
          }
          case Role::kRecvDAR:
          case Role::kRecvSink: {
            uint8_t* view = op.role == Role::kRecvSink ? codec.output_view(args.out, plan, blk) : nullptr;
            if (view) before_output(op.block);
            auto out = view ? BufferPool::view(view, 0) : pool->get(codec.max_message_bytes(plan, blk));
            kernel_timer([&] {
              out->size = codec.decompress_accumulate_recompress(msg, total, local_of(op.block), plan,
                                                                 blk, args.rng, out->data());
            });
            if (op.role == Role::kRecvDAR) {
              pending[size_t(op.block)] = out;
            } else {
              // final bytes -> output values (with a view: in place; see Codec::output_view)
              if (!view) before_output(op.block);
              kernel_timer([&] { codec.decompress(out->data(), out->size, plan, blk, args.out); });
              finals[size_t(op.block)] = out;
            }
            break;
          }
          case Role::kRecvFinal: {
            before_output(op.block);
            // received into an output view: already output values (Codec::output_view)
            if (!pr.buf->ext) kernel_timer([&] { codec.decompress(msg, total, plan, blk, args.out); });
            finals[size_t(op.block)] = pr.buf;
            break;
          }
          default: throw Error("executor: bad receive role");
        }
      } else if (op.role == Role::kLocalSink) {
        auto out = pool->get(codec.max_message_bytes(plan, blk));
        before_output(op.block);
        kernel_timer([&] {
          out->size = codec.compress(local_of(op.block), plan, blk, args.rng, out->data());
          codec.decompress(out->data(), out->size, plan, blk, args.out);
        });
        finals[size_t(op.block)] = out;
      } else if (!posted_with_group[i]) {
        do_send(i);
      }
      if (last_final_use[size_t(op.block)] == i) finals[size_t(op.block)].reset();
      // Completed sends give their buffers back to the pool now, for the next
      // messages to reuse; at most a window of send buffers stays in flight.
      if (!sends.empty()) reap_sends();
    }
    for (auto& s : sends) wait_timer(*s.req);
    sends.clear();
  } catch (...) {
    park_on_failure(memory, posted, sends);
    throw;
  }
}

}  // namespace dynamiq
