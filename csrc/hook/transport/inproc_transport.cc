#include "hook/transport/inproc_transport.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <thread>

namespace dynamiq {

InprocWorld::InprocWorld(int size, std::chrono::milliseconds timeout, const Memory* memory)
    : size_(size), timeout_(timeout), memory_(memory ? *memory : host_memory()) {
  DQ_CHECK(size >= 1, "in-process world: size must be >= 1");
  seq_.resize(size_t(size));
}

void InprocWorld::throw_if_failed_locked() const {
  if (failed_) throw TransportError("in-process peer failed: " + failure_);
}

void InprocWorld::fail(int rank, const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!failed_) {
    failed_ = true;
    failure_ = "rank " + std::to_string(rank) + ": " + why;
  }
  cv_.notify_all();
}

void InprocWorld::record(int rank, int peer, bool send, size_t bytes, uint64_t group, uint32_t tag) {
  std::lock_guard<std::mutex> lk(mu_);
  if (peer >= 0) posted_[{rank, peer}].push_back(Posted{send, bytes, group});
  seq_[size_t(rank)].push_back(Seq{peer, send, bytes, group, tag});
}

std::vector<std::string> InprocWorld::nccl_order_violations() const {
  // A unit: one operation outside a group, or the operations of one group; as
  // a sorted list of (is send, bytes) seen from the poster.
  using Unit = std::vector<std::pair<bool, size_t>>;
  auto units = [&](int a, int b) {
    std::vector<Unit> u;
    auto it = posted_.find({a, b});
    if (it == posted_.end()) return u;
    uint64_t open = 0;
    for (const Posted& p : it->second) {
      if (p.group == 0 || p.group != open) u.emplace_back();
      u.back().emplace_back(p.send, p.bytes);
      open = p.group;
    }
    for (Unit& x : u) std::sort(x.begin(), x.end());
    return u;
  };
  auto describe = [](const Unit& x) {
    std::string d;
    for (const auto& op : x)
      d += (d.empty() ? "" : " + ") + std::string(op.first ? "send" : "receive") + " of " +
           std::to_string(op.second) + " bytes";
    return d.empty() ? std::string("nothing") : d;
  };
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (int a = 0; a < size_; ++a)
    for (int b = a + 1; b < size_; ++b) {
      const std::vector<Unit> ua = units(a, b), ub = units(b, a);
      for (size_t k = 0; k < std::max(ua.size(), ub.size()); ++k) {
        Unit flipped;  // b's unit as a would have to post it
        if (k < ub.size())
          for (const auto& op : ub[k]) flipped.emplace_back(!op.first, op.second);
        std::sort(flipped.begin(), flipped.end());
        const Unit none;
        const Unit& mine = k < ua.size() ? ua[k] : none;
        if (mine != flipped) {
          out.push_back("ranks " + std::to_string(a) + " and " + std::to_string(b) + ", operation " +
                        std::to_string(k) + " between them: rank " + std::to_string(a) + " posts " +
                        describe(mine) + ", rank " + std::to_string(b) + " posts " +
                        describe(k < ub.size() ? ub[k] : none));
          break;
        }
      }
    }
  return out;
}

std::string InprocWorld::nccl_stream_deadlock() const { return simulate_stream(nullptr); }

int64_t InprocWorld::nccl_stream_rounds() const {
  int64_t rounds = -1;
  return simulate_stream(&rounds).empty() ? rounds : -1;
}

std::string InprocWorld::simulate_stream(int64_t* rounds) const {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t n = size_t(size_);
  // units[r][u] = indices into seq_[r]
  std::vector<std::vector<std::vector<size_t>>> units(n);
  for (size_t r = 0; r < n; ++r) {
    uint64_t open = 0;
    for (size_t i = 0; i < seq_[r].size(); ++i) {
      const Seq& e = seq_[r][i];
      if (e.group == 0 || e.group != open) units[r].emplace_back();
      units[r].back().push_back(i);
      open = e.group;
    }
  }
  // partner of every operation: (rank, unit) of the matching one, by FIFO
  // order per direction; all-reduces by their index on each rank
  struct Where {
    size_t rank, unit, op;
  };
  std::map<std::tuple<size_t, size_t, bool>, std::vector<Where>> fifo;  // (from, to, is send)
  std::vector<std::vector<Where>> colls(n);
  for (size_t r = 0; r < n; ++r) {
    for (size_t u = 0; u < units[r].size(); ++u)
      for (size_t i : units[r][u]) {
        const Seq& e = seq_[r][i];
        if (e.peer < 0) colls[r].push_back({r, u, i});
        else if (e.send) fifo[{r, size_t(e.peer), true}].push_back({r, u, i});
        else fifo[{size_t(e.peer), r, false}].push_back({r, u, i});
      }
  }
  auto op_name = [&](size_t r, size_t i) {
    const Seq& e = seq_[r][i];
    if (e.peer < 0) return std::string("all-reduce");
    return std::string(e.send ? "send to " : "receive from ") + std::to_string(e.peer) + " (" +
           std::to_string(e.bytes) + " bytes)";
  };
  std::vector<std::vector<Where>> partner(n);
  for (size_t r = 0; r < n; ++r) partner[r].assign(seq_[r].size(), Where{SIZE_MAX, 0, 0});
  for (const auto& [key, sends] : fifo) {
    if (!std::get<2>(key)) continue;
    const auto it = fifo.find({std::get<0>(key), std::get<1>(key), false});
    const size_t nr = it == fifo.end() ? 0 : it->second.size();
    for (size_t k = 0; k < std::max(sends.size(), nr); ++k) {
      if (k >= sends.size() || k >= nr)
        return "rank " + std::to_string(std::get<0>(key)) + " posts " + std::to_string(sends.size()) +
               " sends to rank " + std::to_string(std::get<1>(key)) + ", which posts " + std::to_string(nr) +
               " receives from it";
      const Where s = sends[k], v = it->second[k];
      if (seq_[s.rank][s.op].bytes != seq_[v.rank][v.op].bytes)
        return "send " + std::to_string(k) + " from rank " + std::to_string(s.rank) + " to rank " +
               std::to_string(v.rank) + " has " + std::to_string(seq_[s.rank][s.op].bytes) +
               " bytes, the receive " + std::to_string(seq_[v.rank][v.op].bytes);
      // NCCL has no tags: the k-th send meets the k-th receive whatever they
      // were meant for, so a message that lands in another's receive (same
      // size, other tag) would be silently wrong data there
      if (seq_[s.rank][s.op].tag != seq_[v.rank][v.op].tag)
        return "send " + std::to_string(k) + " from rank " + std::to_string(s.rank) + " to rank " +
               std::to_string(v.rank) + " has tag " + std::to_string(seq_[s.rank][s.op].tag) +
               ", the receive it meets in posting order tag " + std::to_string(seq_[v.rank][v.op].tag);
      partner[s.rank][s.op] = v;
      partner[v.rank][v.op] = s;
    }
  }
  for (size_t r = 1; r < n; ++r)
    if (colls[r].size() != colls[0].size()) return "ranks post different numbers of all-reduces";
  std::vector<size_t> head(n, 0);
  std::vector<std::vector<uint8_t>> done(n);
  for (size_t r = 0; r < n; ++r) done[r].assign(seq_[r].size(), 0);
  auto running = [&](const Where& w) { return head[w.rank] == w.unit; };
  // Latency rounds: a rank's unit starts when its previous one has finished;
  // an operation finishes one round after both its ends have started (an
  // all-reduce one round after every rank has), a unit with its last operation.
  std::vector<int64_t> start(n, 0), finish(n, 0);
  auto finish_at = [&](size_t r, int64_t t) { finish[r] = std::max(finish[r], t); };
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < n; ++r) {
      if (head[r] >= units[r].size()) continue;
      for (size_t i : units[r][head[r]]) {
        if (done[r][i]) continue;
        const Seq& e = seq_[r][i];
        if (e.peer < 0) {
          size_t c = 0;
          while (colls[r][c].op != i) ++c;
          bool all = true;
          for (size_t q = 0; q < n; ++q) all = all && running(colls[q][c]);
          if (all) {
            int64_t t = 0;
            for (size_t q = 0; q < n; ++q) t = std::max(t, start[q] + 1);
            for (size_t q = 0; q < n; ++q) {
              done[q][colls[q][c].op] = 1;
              finish_at(q, t);
            }
          }
        } else if (running(partner[r][i])) {
          const size_t q = partner[r][i].rank;
          const int64_t t = std::max(start[r], start[q]) + 1;
          done[r][i] = 1;
          done[q][partner[r][i].op] = 1;
          finish_at(r, t);
          finish_at(q, t);
        }
      }
    }
    for (size_t r = 0; r < n; ++r)
      while (head[r] < units[r].size() &&
             std::all_of(units[r][head[r]].begin(), units[r][head[r]].end(),
                         [&](size_t i) { return done[r][i] != 0; })) {
        ++head[r];
        start[r] = finish[r];
        progress = true;
      }
  }
  if (rounds) *rounds = *std::max_element(start.begin(), start.end());
  std::string stuck;
  for (size_t r = 0; r < n; ++r) {
    if (head[r] >= units[r].size()) continue;
    stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " at unit " +
             std::to_string(head[r]) + " [";
    bool first = true;
    for (size_t i : units[r][head[r]]) {
      stuck += (first ? "" : ", ") + op_name(r, i) + (done[r][i] ? " done" : "");
      first = false;
    }
    stuck += "]";
  }
  return stuck.empty() ? std::string() : "deadlock: " + stuck;
}

void InprocWorld::post(int src, int dst, uint32_t tag, const void* data, size_t bytes) {
  DQ_CHECK(dst >= 0 && dst < size_, "in-process send: bad destination rank");
  std::vector<uint8_t> msg(bytes);
  memory_.to_host(msg.data(), data, bytes);
  std::lock_guard<std::mutex> lk(mu_);
  ++messages_posted_;
  mail_[Key{src, dst, tag}].push_back(std::move(msg));
  cv_.notify_all();
}

void InprocWorld::take(int src, int dst, uint32_t tag, void* data, size_t bytes) {
  DQ_CHECK(src >= 0 && src < size_, "in-process recv: bad source rank");
  std::unique_lock<std::mutex> lk(mu_);
  const Key key{src, dst, tag};
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    throw_if_failed_locked();
    auto it = mail_.find(key);
    if (it != mail_.end() && !it->second.empty()) {
      std::vector<uint8_t> msg = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) mail_.erase(it);
      lk.unlock();
      if (msg.size() > bytes || (msg.size() < bytes && !accepts_shorter_))
        throw TransportError("in-process recv from rank " + std::to_string(src) + " tag " +
                             std::to_string(tag) + ": message of " + std::to_string(msg.size()) +
                             " bytes, receive posted for " + std::to_string(bytes));
      memory_.from_host(data, msg.data(), msg.size());
      return;
    }
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      throw TransportError("in-process recv from rank " + std::to_string(src) + " tag " +
                           std::to_string(tag) + " timed out after " +
                           std::to_string(timeout_.count()) + " ms");
    }
  }
}

void InprocWorld::move_locked(const Side& s, const Side& r) {
  if (s.bytes > r.bytes || (s.bytes < r.bytes && !accepts_shorter_)) {
    r.t->error = "message of " + std::to_string(s.bytes) + " bytes, receive posted for " + std::to_string(r.bytes);
    s.t->error = r.t->error;
  } else if (s.bytes > 0) {
    std::vector<uint8_t> tmp(s.bytes);
    memory_.to_host(tmp.data(), s.send, s.bytes);
    memory_.from_host(r.recv, tmp.data(), s.bytes);
  }
  s.t->done = r.t->done = true;
  cv_.notify_all();
}

std::shared_ptr<InprocWorld::Transfer> InprocWorld::post_send_rv(int src, int dst, uint32_t tag,
                                                                 const void* data, size_t bytes) {
  DQ_CHECK(dst >= 0 && dst < size_, "in-process send: bad destination rank");
  std::lock_guard<std::mutex> lk(mu_);
  throw_if_failed_locked();  // a failed rank's buffers may be gone
  ++messages_posted_;
  Side s{data, nullptr, bytes, std::make_shared<Transfer>()};
  const Key key{src, dst, tag};
  auto it = unmatched_recvs_.find(key);
  if (it != unmatched_recvs_.end() && !it->second.empty()) {
    move_locked(s, it->second.front());
    it->second.pop_front();
    if (it->second.empty()) unmatched_recvs_.erase(it);
  } else {
    unmatched_sends_[key].push_back(s);
  }
  return s.t;
}

std::shared_ptr<InprocWorld::Transfer> InprocWorld::post_recv_rv(int src, int dst, uint32_t tag, void* data,
                                                                 size_t bytes) {
  DQ_CHECK(src >= 0 && src < size_, "in-process recv: bad source rank");
  std::lock_guard<std::mutex> lk(mu_);
  throw_if_failed_locked();
  Side r{nullptr, data, bytes, std::make_shared<Transfer>()};
  const Key key{src, dst, tag};
  auto it = unmatched_sends_.find(key);
  if (it != unmatched_sends_.end() && !it->second.empty()) {
    move_locked(it->second.front(), r);
    it->second.pop_front();
    if (it->second.empty()) unmatched_sends_.erase(it);
  } else {
    unmatched_recvs_[key].push_back(r);
  }
  return r.t;
}

void InprocWorld::wait_rv(const Transfer& t, const char* what, int peer, uint32_t tag) {
  std::unique_lock<std::mutex> lk(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const std::string where = std::string("in-process ") + what + " rank " + std::to_string(peer) + " tag " +
                            std::to_string(tag);
  while (!t.done) {
    throw_if_failed_locked();
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout)
      throw TransportError(where + " timed out after " + std::to_string(timeout_.count()) + " ms");
  }
  if (!t.error.empty()) throw TransportError(where + ": " + t.error);
}

int64_t InprocWorld::messages_posted() const {
  std::lock_guard<std::mutex> lk(mu_);
  return messages_posted_;
}

void InprocWorld::allreduce(int rank, int64_t* data, size_t count) {
  (void)rank;
  std::unique_lock<std::mutex> lk(mu_);
  throw_if_failed_locked();
  const uint64_t gen = ar_generation_;
  if (ar_arrived_ == 0) ar_sum_.assign(count, 0);
  DQ_CHECK(ar_sum_.size() == count, "in-process all-reduce: ranks passed different lengths");
  for (size_t i = 0; i < count; ++i) ar_sum_[i] += data[i];
  if (++ar_arrived_ == size_) {
    ar_result_ = ar_sum_;
    ar_arrived_ = 0;
    ++ar_generation_;
    cv_.notify_all();
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (ar_generation_ == gen) {
      throw_if_failed_locked();
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout)
        throw TransportError("in-process all-reduce timed out");
    }
  }
  std::memcpy(data, ar_result_.data(), count * sizeof(int64_t));
}

void InprocWorld::run(const std::function<void(int, Transport&)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size_));
  std::vector<std::thread> threads;
  threads.reserve(size_t(size_));
  for (int r = 0; r < size_; ++r) {
    threads.emplace_back([&, r] {
      InprocTransport t(*this, r);
      try {
        fn(r, t);
      } catch (const std::exception& e) {
        errors[size_t(r)] = std::current_exception();
        fail(r, e.what());
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        fail(r, "unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  // Prefer the root cause over "peer failed" follow-ups.
  std::exception_ptr first, first_root;
  for (auto& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const TransportError& te) {
      if (std::string(te.what()).rfind("in-process peer failed", 0) == 0) continue;
      if (!first_root) first_root = e;
    } catch (...) {
      if (!first_root) first_root = e;
    }
  }
  if (first_root) std::rethrow_exception(first_root);
  if (first) std::rethrow_exception(first);
}

namespace {

class InprocRecv final : public Request {
 public:
  InprocRecv(InprocWorld& w, int src, int dst, uint32_t tag, void* buf, size_t bytes)
      : w_(w), src_(src), dst_(dst), tag_(tag), buf_(buf), bytes_(bytes) {}
  void wait() override {
    if (done_) return;
    w_.take(src_, dst_, tag_, buf_, bytes_);
    done_ = true;
  }

 private:
  InprocWorld& w_;
  int src_, dst_;
  uint32_t tag_;
  void* buf_;
  size_t bytes_;
  bool done_ = false;
};

// Rendezvous mode (see InprocWorld::set_rendezvous_sends).
class RendezvousRequest final : public Request {
 public:
  RendezvousRequest(InprocWorld& w, std::shared_ptr<InprocWorld::Transfer> t, bool send, int peer, uint32_t tag)
      : w_(w), t_(std::move(t)), send_(send), peer_(peer), tag_(tag) {}
  void wait() override {
    if (waited_) return;
    w_.wait_rv(*t_, send_ ? "send to" : "recv from", peer_, tag_);
    waited_ = true;
  }
  // As Gloo's SendWork: completion is reported only after wait().
  bool test() override { return waited_; }

 private:
  InprocWorld& w_;
  std::shared_ptr<InprocWorld::Transfer> t_;
  bool send_;
  int peer_;
  uint32_t tag_;
  bool waited_ = false;
};

}  // namespace

std::unique_ptr<Request> InprocTransport::irecv(void* buf, size_t bytes, int src, uint32_t tag) {
  world_.record(rank_, src, false, bytes, group_, tag);
  if (world_.rendezvous_sends())
    return std::make_unique<RendezvousRequest>(world_, world_.post_recv_rv(src, rank_, tag, buf, bytes), false,
                                               src, tag);
  return std::make_unique<InprocRecv>(world_, src, rank_, tag, buf, bytes);
}

std::unique_ptr<Request> InprocTransport::isend(const void* buf, size_t bytes, int dst,
                                                uint32_t tag) {
  world_.record(rank_, dst, true, bytes, group_, tag);
  if (world_.rendezvous_sends())
    return std::make_unique<RendezvousRequest>(world_, world_.post_send_rv(rank_, dst, tag, buf, bytes), true,
                                               dst, tag);
  world_.post(rank_, dst, tag, buf, bytes);
  return std::make_unique<DoneRequest>();
}

void InprocTransport::allreduce_sum_i64(int64_t* data, size_t count) {
  world_.record(rank_, -1, false, count * sizeof(int64_t), group_);
  world_.allreduce(rank_, data, count);
}

void InprocTransport::group_start() {
  if (group_depth_++ == 0) group_ = ++next_group_;
}

void InprocTransport::group_end() {
  if (group_depth_ > 0 && --group_depth_ == 0) group_ = 0;
}

}  // namespace dynamiq
