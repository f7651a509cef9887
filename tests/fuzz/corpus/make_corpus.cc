// Writes the seed corpus of every fuzz target from real messages of each mode (no blobs in
// the repository): `fuzz_corpus OUT` creates OUT/<target>/seed-NNNN. Deterministic: the
// same build writes the same files. scripts/fuzz.sh runs it before fuzzing.
//
//   fuzz_codec_<mode>: prefix (fuzz_codec.h) + the block's message as a peer's compress
//       writes it, for a spread of dtypes, sizes, worlds, blocks, roles and mode parameters;
//       each seed is checked to decode cleanly in its role.
//   fuzz_lossless_block: lossless_encode of values that give every exponent format (plain,
//       const, zip, Huffman), 0 .. 20000 values; each format is required at least once.
//   fuzz_plan: the statistics of real buckets (local pass times the world).
//   fuzz_collective: a real all_reduce of 2-5 ranks over the in-process transport,
//       recording what one rank receives in the order it waits for it; replayed by the
//       target with an honest header, that rank runs the same collective to the end.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "fuzz_codec.h"
#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/lossless/lossless_codec.h"

using namespace dqfuzz;
namespace fs = std::filesystem;

namespace {

fs::path g_out;
std::map<std::string, int> g_count;

void write_seed(const std::string& target, const std::vector<uint8_t>& bytes) {
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  char name[32];
  std::snprintf(name, sizeof name, "seed-%04d", g_count[target]++);
  std::ofstream f(dir / name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// ---- codecs ------------------------------------------------------------------------------

std::vector<std::array<uint8_t, 8>> mode_variants(Mode m) {
  if (m == mode_id("dynamiq"))
    return {
        {56, 0, 0, 0, 0, 0, 0, 0},          // bits 5, widths {2,4,8}, S 256, s 16
        {24, 0, 0, 0, 0, 0, 0, 0},          // bits 3
        {120, 0x1f, 0, 0, 0, 0, 0, 0},      // bits 9, every width 1..16
        {40, 0x03, 0, 0, 0, 0, 0, 0},       // bits 4, widths {1, 2}
        {56, 0, 0, 1, 0, 0, 0, 0},          // flat scales
        {56, 0, 0, 2, 0, 0, 0, 0},          // uniform levels
        {56, 0, 0, 4 | 8, 0, 0, 0, 0},      // exact allocator, independent rounding
        {56, 0, 0, 16, 77, 20, 0, 0},       // custom eps
        {72, 0x1c, 1 + 4 * 1, 0, 0, 0, 0, 0},   // s 8, S 64, widths {4, 8, 16}
        {56, 0, 2 + 4 * 3, 0, 0, 0, 0, 0},  // s 32, S 512
        {250, 0x10, 3 + 4 * 2, 0, 0, 0, 0, 0},  // width 16 only, s 64, S 128
    };
  if (m == mode_id("bitsplit")) {
    std::vector<std::array<uint8_t, 8>> v;
    for (int b = 0; b < 7; ++b) v.push_back({uint8_t(b), 0, 0, 0, 0, 0, 0, 0});  // bits 2..8, defaults
    v.push_back({2, 5, 2, 0, 0, 0, 0, 0});  // 4 bits, group 256, spikes on
    v.push_back({0, 1, 1, 1, 0, 0, 0, 0});  // 2 bits, group 32, spikes off, log scales
    v.push_back({1, 3, 2, 2, 0, 0, 0, 0});  // 3 bits, group 96, spikes, nearest
    v.push_back({6, 4, 2, 1, 0, 0, 0, 0});  // 8 bits, group 128, spikes, log scales
    return v;
  }
  if (m == mode_id("bounded"))
    return {
        {0, 0, 70, 0, 0, 0, 0, 0},    // error_bound 2^-10
        {0, 128, 60, 0, 0, 0, 0, 0},  // 1.5 x 2^-20
        {0, 0, 95, 0, 0, 0, 0, 0},    // 2^15: almost everything in bin 0
        {0, 0, 0, 0, 0, 0, 0, 0},     // 2^-80: every block raw
        {1, 0, 10, 0, 0, 0, 0, 0},    // relative 2^-18
    };
  return {{0, 0, 0, 0, 0, 0, 0, 0}};
}

void codec_seeds(Mode m, const std::string& target) {
  static const int64_t kNumel[] = {1, 7, 100, 256, 257, 1000, 2048, 4096, 6144};
  const auto variants = mode_variants(m);
  int written = 0;
  for (int i = 0; i < 160 && written < 60; ++i) {
    CodecCase c;
    c.mode = m;
    c.role = RecvRole(i % 4);
    c.mean = (i / 4) % 2;
    c.fix_size = (i / 3) % 2;
    c.fix_crc = m == mode_id("lossless") && (i / 5) % 2;
    c.dtype = DType(i % 3);
    c.style = (i / 7) % 3;
    c.numel = kNumel[(i * 5) % 9];
    c.world = 2 + (i * 3) % 7;
    c.rank = i % c.world;
    c.block = i / 2;
    c.block_bytes = int64_t(64) << ((i * 7) % 12);
    const auto& v = variants[size_t(i) % variants.size()];
    std::memcpy(c.mode_params, v.data(), 8);
    c.seed = 1000 + uint64_t(i);
    CodecSetup s;
    if (!make_setup(c, s)) continue;
    const Codec& codec = s.codec();
    std::vector<uint8_t> msg(codec.max_message_bytes(s.plan, s.block));
    Local x;
    x.bucket = s.bucket.data();
    const size_t n = codec.compress(x, s.plan, s.block, s.rng, msg.data());
    msg.resize(n);
    // the seed must decode cleanly in its role
    std::vector<uint8_t> y(s.bucket.size());
    Output o = s.out;
    o.bucket = y.data();
    codec.decompress(msg.data(), msg.size(), s.plan, s.block, o);
    std::vector<uint8_t> bytes(kCodecPrefix);
    c.encode(bytes.data());
    FUZZ_CHECK(CodecCase::decode(m, bytes.data()).numel == c.numel, "prefix round trip");
    bytes.insert(bytes.end(), msg.begin(), msg.end());
    write_seed(target, bytes);
    ++written;
  }
  FUZZ_CHECK(written >= 10, target + ": only " + std::to_string(written) + " seeds");
}

// ---- lossless blocks -----------------------------------------------------------------------

void lossless_seeds() {
  int by_format[4] = {0, 0, 0, 0};
  static const int64_t kN[] = {0, 5, 8, 64, 1000, 1031, 4096, 8200, 12000, 19999};
  int i = 0;
  for (int64_t n : kN)
    for (int style = 0; style < 6; ++style, ++i) {
      const DType t = DType(i % 3);
      const size_t es = size_t(dtype_size(t));
      std::vector<uint8_t> v(size_t(n) * es);
      switch (style) {
        case 0: case 1: case 2: fill_values(v.data(), t, n, 77 + uint64_t(i), style, false); break;
        case 3:  // [1, 2): one exponent (const)
          fill_values(v.data(), t, n, 5 + uint64_t(i), 3, false);
          for (int64_t k = 0; k < n; ++k) {
            const float f = 1.0f + float(k % 97) / 97.0f;
            if (t == DType::kF32) std::memcpy(v.data() + 4 * k, &f, 4);
            else reinterpret_cast<uint16_t*>(v.data())[k] = t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
          }
          break;
        case 4:  // random bits (plain)
          for (size_t k = 0; k < v.size(); ++k) v[k] = uint8_t(philox4x32_10(uint32_t(k), 0, 0, 0, uint32_t(i), 9).v[0]);
          break;
        case 5:  // a few exponents and rare outliers (zip with escapes)
          fill_values(v.data(), t, n, 3 + uint64_t(i), 0, false);
          for (int64_t k = 0; k < n; k += 101) {
            const float f = 1e-20f;
            if (t == DType::kF32) std::memcpy(v.data() + 4 * k, &f, 4);
            else reinterpret_cast<uint16_t*>(v.data())[k] = t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(3e-7f);
          }
          break;
      }
      std::vector<uint8_t> msg(lossless_static_bytes(t, n) + lossless_max_dynamic_bytes(t, n));
      const size_t m = lossless_encode(v.data(), t, n, msg.data());
      msg.resize(m);
      std::vector<uint8_t> out(v.size());
      lossless_decode(msg.data(), msg.size(), t, n, out.data());
      FUZZ_CHECK(out == v, "lossless seed round trip");
      by_format[int(lossless_format_of(msg.data()))] += 1;
      std::vector<uint8_t> bytes(8, 0);
      bytes[0] = uint8_t(t);
      bytes[1] = uint8_t(i % 2 ? 0 : 1);  // half with the CRC fix-up on
      bytes[2] = uint8_t(n), bytes[3] = uint8_t(n >> 8);
      bytes.insert(bytes.end(), msg.begin(), msg.end());
      write_seed("fuzz_lossless_block", bytes);
    }
  for (int f = 0; f < 4; ++f)
    FUZZ_CHECK(by_format[f] > 0, std::string("no lossless seed of format ") + lossless::exp_format_name(lossless::ExpFormat(f)));
  std::printf("fuzz_lossless_block: formats plain %d, const %d, zip %d, huffman %d\n", by_format[0], by_format[1],
              by_format[2], by_format[3]);
}

// ---- plans ---------------------------------------------------------------------------------

void plan_seeds() {
  const auto variants = mode_variants(mode_id("dynamiq"));
  static const int64_t kNumel[] = {1, 256, 1000, 4096, 19999};
  int i = 0;
  for (const auto& v : variants)
    for (int64_t numel : kNumel) {
      ++i;
      CodecCase c;
      c.mode = mode_id("dynamiq");
      std::memcpy(c.mode_params, v.data(), 8);
      const CollectiveConfig cfg = config_of(c);
      std::unique_ptr<Scheme> sc;
      try {
        sc = make_scheme(cfg);
      } catch (const Error&) {
        continue;
      }
      if (!sc->fits_budget(numel)) continue;
      std::vector<float> x(static_cast<size_t>(numel));
      fill_values(x.data(), DType::kF32, numel, uint64_t(i), 1 + i % 2);
      std::vector<float> stats(size_t(sc->stats_count(DType::kF32, numel)));
      sc->local_pass(x.data(), DType::kF32, numel, stats.data());
      const int world = 1 + i % 16;
      for (float& f : stats) f *= float(world);
      std::vector<uint8_t> bytes(32, 0);
      std::memcpy(bytes.data(), v.data(), 8);
      const uint16_t nm = uint16_t(numel - 1);
      bytes[8] = uint8_t(nm), bytes[9] = uint8_t(nm >> 8);
      bytes[10] = uint8_t(world - 1);
      bytes[11] = uint8_t(i % 3);
      if (i % 2) {  // a carried state near a real one
        bytes[12] = 1;
        const double u = -2.5 + i, step = 0.125;
        std::memcpy(bytes.data() + 16, &u, 8);
        std::memcpy(bytes.data() + 24, &step, 8);
      }
      const uint8_t* sp = reinterpret_cast<const uint8_t*>(stats.data());
      bytes.insert(bytes.end(), sp, sp + stats.size() * sizeof(float));
      write_seed("fuzz_plan", bytes);
    }
}

// ---- whole collectives ----------------------------------------------------------------------

// Wraps a rank's transport and records the bytes of every receive in the order they are
// waited for (what fuzz_collective's transport hands out in that order).
class Recorder final : public Transport {
 public:
  Recorder(Transport& t, std::vector<uint8_t>* log) : t_(t), log_(log) {}
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  bool posts_in_order() const override { return t_.posts_in_order(); }
  bool accepts_shorter_messages() const override { return t_.accepts_shorter_messages(); }
  void group_start() override { t_.group_start(); }
  void group_end() override { t_.group_end(); }
  void allreduce_sum_i64(int64_t* d, size_t n) override { t_.allreduce_sum_i64(d, n); }
  std::unique_ptr<Request> isend(const void* b, size_t n, int dst, uint32_t tag) override {
    return t_.isend(b, n, dst, tag);
  }
  std::unique_ptr<Request> irecv(void* b, size_t n, int src, uint32_t tag) override {
    class R final : public Request {
     public:
      R(std::unique_ptr<Request> in, void* b, size_t n, std::vector<uint8_t>* log)
          : in_(std::move(in)), b_(b), n_(n), log_(log) {}
      void wait() override {
        if (done_) return;
        in_->wait();
        done_ = true;
        if (log_) log_->insert(log_->end(), static_cast<uint8_t*>(b_), static_cast<uint8_t*>(b_) + n_);
      }
      bool test() override { return done_; }

     private:
      std::unique_ptr<Request> in_;
      void* b_;
      size_t n_;
      std::vector<uint8_t>* log_;
      bool done_ = false;
    };
    return std::make_unique<R>(t_.irecv(b, n, src, tag), b, n, log_);
  }

 private:
  Transport& t_;
  std::vector<uint8_t>* log_;
};

void collective_seeds() {
  static const int64_t kNumel[] = {1, 300, 1024, 3000, 5000};
  int written = 0;
  for (int i = 0; i < 48; ++i) {
    std::vector<uint8_t> p(32, 0);
    const Mode mode = Mode(i % 4);
    p[0] = uint8_t(mode);
    const DType dtype = DType((i / 4) % 3);
    const int style = (i / 3) % 3;
    p[1] = uint8_t(int(dtype) | ((i % 5 == 0) ? 4 : 0) | (style << 3));
    const int64_t numel = kNumel[i % 5];
    const uint16_t nm = uint16_t(numel - 1);
    p[2] = uint8_t(nm), p[3] = uint8_t(nm >> 8);
    const int world = 2 + (i / 2) % 4;
    p[4] = uint8_t(world - 2);
    const int rank = i % world;
    p[5] = uint8_t(rank);
    p[6] = uint8_t((i / 5) % 3);
    p[7] = uint8_t((i / 7) % 3);  // exact sizes, NCCL-like order, Gloo-like shorter messages
    p[13] = uint8_t((i % 9 == 0 ? 1 : 0) | (i % 2 ? 2 : 0));
    p[14] = uint8_t(i % 3 == 0 ? 0 : 4 + i % 8);
    const auto variants = mode_variants(mode);
    std::memcpy(p.data() + 16, variants[size_t(i / 4) % variants.size()].data(), 8);
    const uint64_t seed = 500 + uint64_t(i);
    std::memcpy(p.data() + 24, &seed, 8);

    // the target's config and this rank's values, exactly as the target makes them
    CodecCase c;
    c.mode = mode;
    std::memcpy(c.mode_params, p.data() + 16, 8);
    c.seed = seed;
    CollectiveConfig cfg = config_of(c);
    cfg.topology = topology_of(p[6]);
    cfg.min_compress_numel = 0;
    if (p[13] & 1) cfg.max_collective_bytes = 1;
    cfg.block_bytes = p[14] == 0 ? 0 : int64_t(64) << (p[14] % 12);
    const size_t es = size_t(dtype_size(dtype));
    std::vector<std::vector<uint8_t>> data(size_t(world), std::vector<uint8_t>(size_t(numel) * es));
    fill_values(data[size_t(rank)].data(), dtype, numel, seed, style, false);
    const bool nf = has_nonfinite(data[size_t(rank)].data(), dtype, numel);
    for (int r = 0; r < world; ++r) {
      if (r == rank) continue;
      fill_values(data[size_t(r)].data(), dtype, numel, seed + 7919 * uint64_t(r + 1), style, false);
      if (has_nonfinite(data[size_t(r)].data(), dtype, numel) != nf) data[size_t(r)] = data[size_t(rank)];
    }
    InprocWorld w(world, std::chrono::seconds(60));
    w.set_posts_in_order(p[7] & 1);
    w.set_accepts_shorter_messages(p[7] & 2);
    std::vector<uint8_t> log;
    bool ok = true;
    try {
      w.run([&](int r, Transport& t) {
        Recorder rec(t, r == rank ? &log : nullptr);
        PlanState ps;
        CallArgs a;
        a.data = data[size_t(r)].data();
        a.dtype = dtype;
        a.numel = numel;
        a.op = (p[1] & 4) ? ReduceOp::kMean : ReduceOp::kSum;
        a.seq = 1;
        a.plan_state = (p[13] & 2) ? &ps : nullptr;
        all_reduce(rec, cfg, a);
      });
    } catch (const Error& e) {
      ok = false;  // a config make_scheme rejects: not a seed
    }
    if (!ok) continue;
    p.insert(p.end(), log.begin(), log.end());
    write_seed("fuzz_collective", p);
    ++written;
  }
  FUZZ_CHECK(written >= 20, "fuzz_collective: only " + std::to_string(written) + " seeds");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  codec_seeds(mode_id("dynamiq"), "fuzz_codec_dynamiq");
  codec_seeds(mode_id("lossless"), "fuzz_codec_lossless");
  codec_seeds(mode_id("bitsplit"), "fuzz_codec_bitsplit");
  codec_seeds(mode_id("bounded"), "fuzz_codec_bounded");
  codec_seeds(kModeNone, "fuzz_codec_identity");
  lossless_seeds();
  plan_seeds();
  collective_seeds();
  for (const auto& [t, n] : g_count) std::printf("%s: %d seeds\n", t.c_str(), n);
  return 0;
}
