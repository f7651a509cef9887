// libFuzzer target: one rank of a whole all_reduce (collective.cc, executor.cc) whose peers
// are the fuzzer. The header exchange is not a separate function (an int64 all-reduce
// decoded inside all_reduce), so it is fuzzed here, through a transport whose all-reduce
// returns what honest peers would send (this rank's vector times the world) with fuzzed
// changes, or a fuzzed vector outright; every receive is then filled from the fuzz bytes
// (the metadata all-reduce of the statistics, then the data messages of every step, with
// the executor's dynamic_bytes and the codecs behind them). A receive the bytes run out for
// raises TransportError, as a closed connection does.
//
// Input: a 32-byte prefix, then the stream of received bytes.
//   p[0]  mode (mod 4); p[1] bits 0-1 dtype (mod 3), bit 2 op mean, (p[1] >> 3) % 4 value style
//   p[2..3] numel = 1 + u16 % 5000; p[4] world = 2 + p[4] % 4; p[5] rank (mod world);
//   p[6]  topology (topology_of: the registered schedules, by id)
//   p[7]  transport: bit 0 posts in order (NCCL-like), bit 1 accepts shorter messages (Gloo),
//         bit 2 with bit 1: each receive reads a 2-byte length first and delivers at most that
//   p[8]  header: 0 honest; 1 add fuzzed int64s (from the stream) at 1-4 positions (p[9..12]);
//         2 the whole vector from the stream; 3 honest but position p[9] is off by p[10] - 128
//   p[13] bit 0 slices of 4096 elements (max_collective_bytes), bit 1 a carried PlanState
//   p[14] block_bytes = 0 (default) or 64 << (p[14] % 12)
//   p[16..23] mode parameters (fuzz_codec.h config_of); p[24..31] seed (config and values)
//
// Accepted ends: a return, or any dynamiq::Error (MalformedMessage, TransportError, the
// header's "ranks disagree" / "aborted on every rank"). Anything else is a finding.
//
// The collective runs as on a device (CallArgs::device) whose memory is host memory that the
// harness owns: after a failure the executor parks its buffers for ever (a real backend may
// still write into posted receives), which in a fuzzer that fails most inputs would grow
// without bound; this memory frees them once the collective has returned (FuzzMemory::free_all;
// the thread's pool map still gains one small entry per failure).
#include <cstring>
#include <set>
#include <vector>

#include "fuzz_codec.h"
#include "hook/collective/collective.h"
#include "kernels/device.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/lossless/lossless_codec.h"
#include "kernels/registry.h"

using namespace dqfuzz;

namespace {

class FuzzMemory final : public Memory {
 public:
  std::string name() const override { return "fuzz-host"; }
  void* allocate(size_t bytes) const override {
    void* p = ::operator new[](bytes > 0 ? bytes : 1);
    live_.insert(p);
    return p;
  }
  void release(void* p) const override {
    // a pool abandoned by free_all may release at thread exit what was freed already
    if (live_.erase(p)) ::operator delete[](p);
  }
  void to_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void from_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  // The executor keeps one buffer pool per (Memory, domain) and thread.
  int domain() const override { return generation_; }
  // After a failed collective: frees every allocation (parked by the executor, or held by a
  // pool that a failure outside the executor left live) and moves to a new domain, so that
  // the next collective starts a new pool; the old pools are never used again.
  void free_all() const {
    for (void* p : live_) ::operator delete[](p);
    live_.clear();
    ++generation_;
  }

 private:
  mutable std::set<void*> live_;
  mutable int generation_ = 0;
};

// Host codecs behind a Memory of the fuzzer's own: the device path with CPU codecs, each
// mode's device codec registered under this device's name (as a GPU's are under "cuda").
class FuzzDevice final : public Device {
 public:
  FuzzDevice() {
    static const bool registered = [] {
      DeviceCodecFactory id;
      id.make_codec = [](const Codec&, const Device&) { return std::make_unique<IdentityCodec>(); };
      register_device_codec("none", "fuzz-host", id);
      DeviceCodecFactory dq;
      dq.make_codec = [](const Codec& host, const Device&) {
        return std::make_unique<DynamiqCodec>(host_codec_as<DynamiqCodec>(host).params());
      };
      dq.local_pass = [](const Codec& host, const Device&, const void* data, DType dtype, int64_t numel,
                         float* stats) {
        return dynamiq_local_stats(data, dtype, numel, host_codec_as<DynamiqCodec>(host).params().fmt.S, stats);
      };
      register_device_codec("dynamiq", "fuzz-host", dq);
      DeviceCodecFactory bs;
      bs.make_codec = [](const Codec& host, const Device&) {
        return std::make_unique<BitsplitCodec>(host_codec_as<BitsplitCodec>(host).params());
      };
      register_device_codec("bitsplit", "fuzz-host", bs);
      DeviceCodecFactory ll;
      ll.make_codec = [](const Codec& host, const Device&) {
        return std::make_unique<LosslessCodec>(host_codec_as<LosslessCodec>(host).options());
      };
      register_device_codec("lossless", "fuzz-host", ll);
      return true;
    }();
    (void)registered;
  }
  std::string name() const override { return "fuzz-host"; }
  const Memory& memory() const override { return mem_; }
  void* stream() const override { return nullptr; }
  bool has_nonfinite(const void* data, DType dtype, int64_t numel) const override {
    return dynamiq::has_nonfinite(data, dtype, numel);
  }
  const FuzzMemory& fuzz_memory() const { return mem_; }

 private:
  FuzzMemory mem_;
};

struct Stream {
  const uint8_t* p;
  size_t n;
  bool take(void* dst, size_t k) {
    if (k > n) return false;
    if (k) std::memcpy(dst, p, k);
    p += k;
    n -= k;
    return true;
  }
};

class Done final : public Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class FuzzRecv final : public Request {
 public:
  FuzzRecv(Stream& s, void* buf, size_t bytes, bool shorter) : s_(s), buf_(buf), bytes_(bytes), shorter_(shorter) {}
  void wait() override {
    if (done_) return;
    size_t k = bytes_;
    if (shorter_) {
      uint16_t len = 0;
      if (!s_.take(&len, 2)) throw TransportError("fuzz peer: connection closed");
      k = std::min<size_t>(k, len);
    }
    if (!s_.take(buf_, k)) throw TransportError("fuzz peer: connection closed");
    done_ = true;
  }
  bool test() override { return done_; }

 private:
  Stream& s_;
  void* buf_;
  size_t bytes_;
  bool shorter_;
  bool done_ = false;
};

class PeerTransport final : public Transport {
 public:
  PeerTransport(int rank, int size, Stream& s, const uint8_t* p) : rank_(rank), size_(size), s_(s), p_(p) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool posts_in_order() const override { return p_[7] & 1; }
  bool accepts_shorter_messages() const override { return p_[7] & 2; }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, uint32_t) override {
    FUZZ_CHECK(src >= 0 && src < size_ && src != rank_, "receive from rank " + std::to_string(src));
    return std::make_unique<FuzzRecv>(s_, buf, bytes, accepts_shorter_messages() && (p_[7] & 4));
  }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, uint32_t) override {
    FUZZ_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send to rank " + std::to_string(dst));
    sink_.resize(bytes);
    if (bytes) std::memcpy(sink_.data(), buf, bytes);  // every byte sent must be readable
    return std::make_unique<Done>();
  }
  void allreduce_sum_i64(int64_t* h, size_t count) override {
    for (size_t i = 0; i < count; ++i) h[i] = int64_t(uint64_t(h[i]) * uint64_t(size_));
    switch (p_[8] % 4) {
      case 0: break;
      case 1:
        for (int k = 0; k <= (p_[9] & 3); ++k) {
          int64_t v = 0;
          if (!s_.take(&v, 8)) break;
          const size_t i = p_[10 + (k % 3)] % count;
          h[i] = int64_t(uint64_t(h[i]) + uint64_t(v));
        }
        break;
      case 2:
        for (size_t i = 0; i < count; ++i)
          if (!s_.take(&h[i], 8)) break;
        break;
      case 3: h[p_[9] % count] += int64_t(p_[10]) - 128; break;
    }
  }

 private:
  int rank_, size_;
  Stream& s_;
  const uint8_t* p_;
  std::vector<uint8_t> sink_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const FuzzDevice device;
  Input<32> in(data, size);
  const uint8_t* p = in.p;
  CodecCase c;
  c.mode = Mode(p[0] % 4);  // the registry's ids: none 0, dynamiq 1, lossless 2, bitsplit 3
  std::memcpy(c.mode_params, p + 16, 8);
  std::memcpy(&c.seed, p + 24, 8);
  CollectiveConfig cfg = config_of(c);
  cfg.topology = topology_of(p[6]);
  cfg.min_compress_numel = 0;
  if (p[13] & 1) cfg.max_collective_bytes = 1;  // slices of 4096 elements
  cfg.block_bytes = p[14] == 0 ? 0 : int64_t(64) << (p[14] % 12);
  const DType dtype = DType((p[1] & 3) % 3);
  const int64_t numel = 1 + in.u16(2) % 5000;
  const int world = 2 + p[4] % 4;
  const int rank = p[5] % world;

  std::vector<uint8_t> bucket(size_t(numel) * size_t(dtype_size(dtype)));
  fill_values(bucket.data(), dtype, numel, c.seed, (p[1] >> 3) % 4, false);
  Stream s{in.rest, in.rest_bytes};
  PeerTransport tr(rank, world, s, p);
  PlanState ps;
  CallArgs a;
  a.data = bucket.data();
  a.dtype = dtype;
  a.numel = numel;
  a.op = (p[1] & 4) ? ReduceOp::kMean : ReduceOp::kSum;
  a.seq = 1;
  a.plan_state = (p[13] & 2) ? &ps : nullptr;
  a.device = &device;
  static const bool verbose = std::getenv("DQFUZZ_VERBOSE") != nullptr;
  try {
    all_reduce(tr, cfg, a);
    if (verbose) std::fprintf(stderr, "collective: completed, %zu bytes left\n", s.n);
  } catch (const Error& e) {
    if (verbose) std::fprintf(stderr, "collective: %s\n", e.what());
    device.fuzz_memory().free_all();
  } catch (const std::exception& e) {
    fail(std::string("all_reduce raised something other than dynamiq::Error: ") + e.what());
  }
  return 0;
}
