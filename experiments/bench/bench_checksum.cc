// What a per-message checksum would cost next to the codecs (docs/reliability.md: the
// decision on checksums). One thread, thread CPU time, best of repeated runs.
//
//   build/cpp/bench_checksum [numel=4194304] [min_seconds=0.3]
//
// Checksums, in GB/s of message bytes: CRC32C with the SSE4.2 crc32 instruction (one stream:
// each step waits for the previous one, 3 cycles; and three independent streams over thirds of
// the message, what a trailer of three CRCs would cost), a table CRC32C (slicing-by-8, what a
// CPU without the instruction runs), and XXH64 (written from its public specification; not
// cryptographic, 64-bit). Codecs, in ns per element of a float32 bucket planned as a collective
// plans it (world 4, ring, 1 MiB blocks): the middle hop (decompress_accumulate_recompress),
// the leaf (compress) and the sink (decompress) of modes dynamiq (bits 5), lossless, bitsplit
// (4 bits) and none (identity), with each message's wire bytes per element. Overhead of a
// checksum = (sender's + receiver's checksum over the message) / the hop's codec time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__SSE4_2__)
#include <nmmintrin.h>
#define HAVE_CRC32_INSN 1
#endif

#include "hook/collective/config.h"
#include "hook/collective/schedule.h"
#include "kernels/scheme.h"
#include "kernels/registry.h"

using namespace dynamiq;

namespace {

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
double time_best(const std::function<void()>& fn, double min_s) {
  fn();
  double best = 1e30, total = 0;
  int reps = 0;
  while (total < min_s || reps < 3) {
    const double t0 = thread_seconds();
    fn();
    const double dt = thread_seconds() - t0;
    best = std::min(best, dt);
    total += dt;
    ++reps;
  }
  return best;
}
volatile uint64_t g_sink;

// ---- checksums --------------------------------------------------------------------------

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), slicing-by-8 tables.
struct Crc32cTables {
  uint32_t t[8][256];
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};
const Crc32cTables& crc_tables() {
  static const Crc32cTables t;
  return t;
}
uint32_t crc32c_table(const uint8_t* p, size_t n, uint32_t crc = 0) {
  const auto& T = crc_tables().t;
  crc = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = T[7][w & 0xff] ^ T[6][(w >> 8) & 0xff] ^ T[5][(w >> 16) & 0xff] ^ T[4][(w >> 24) & 0xff] ^
          T[3][(w >> 32) & 0xff] ^ T[2][(w >> 40) & 0xff] ^ T[1][(w >> 48) & 0xff] ^ T[0][w >> 56];
    p += 8, n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ T[0][(crc ^ *p++) & 0xff];
  return ~crc;
}
#ifdef HAVE_CRC32_INSN
uint32_t crc32c_hw(const uint8_t* p, size_t n, uint32_t crc = 0) {
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8, n -= 8;
  }
  uint32_t c32 = uint32_t(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
// Three independent CRCs over the thirds of the message (three dependency chains in flight).
void crc32c_hw3(const uint8_t* p, size_t n, uint32_t out[3]) {
  const size_t third = (n / 3) & ~size_t(7);
  const uint8_t* q[3] = {p, p + third, p + 2 * third};
  uint64_t c[3] = {~0ull, ~0ull, ~0ull};
  for (size_t i = 0; i + 8 <= third; i += 8)
    for (int k = 0; k < 3; ++k) {
      uint64_t w;
      std::memcpy(&w, q[k] + i, 8);
      c[k] = _mm_crc32_u64(c[k], w);
    }
  out[0] = ~uint32_t(c[0]);
  out[1] = ~uint32_t(c[1]);
  out[2] = crc32c_hw(p + 2 * third, n - 2 * third, ~uint32_t(c[2]));
}
#endif

// XXH64 (Yann Collet's specification, xxhash.com/doc/xxhash_spec.md), written from the spec.
constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                   P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t round64(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
inline uint64_t merge64(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * P1 + P4; }
inline uint64_t rd64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t xxh64(const uint8_t* p, size_t n, uint64_t seed = 0) {
  const uint8_t* end = p + n;
  uint64_t h;
  if (n >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const uint8_t* limit = end - 32;
    do {
      v1 = round64(v1, rd64(p)), v2 = round64(v2, rd64(p + 8)), v3 = round64(v3, rd64(p + 16)),
      v4 = round64(v4, rd64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge64(h, v1), h = merge64(h, v2), h = merge64(h, v3), h = merge64(h, v4);
  } else {
    h = seed + P5;
  }
  h += uint64_t(n);
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round64(0, rd64(p)), 27) * P1 + P4;
  if (p + 4 <= end) h = rotl(h ^ (uint64_t(rd32(p)) * P1), 23) * P2 + P3, p += 4;
  for (; p < end; ++p) h = rotl(h ^ (uint64_t(*p) * P5), 11) * P1;
  h ^= h >> 33, h *= P2, h ^= h >> 29, h *= P3, h ^= h >> 32;
  return h;
}

// ---- codecs -----------------------------------------------------------------------------

struct CodecRow {
  std::string name;
  double hop_ns = 0, leaf_ns = 0, sink_ns = 0;  // per element
  double wire_bytes = 0;                        // per element, of the hop's messages
};

CodecRow time_codec(const std::string& name, const CollectiveConfig& cfg, const std::vector<float>& x,
                    double min_s) {
  const int world = 4;
  const int64_t numel = int64_t(x.size());
  const auto scheme = make_scheme(cfg);
  std::vector<float> stats(size_t(scheme->stats_count(DType::kF32, numel)));
  if (!stats.empty()) {
    scheme->local_pass(x.data(), DType::kF32, numel, stats.data());
    for (float& f : stats) f *= float(world);
  }
  PlanState ps;
  PlanInfo info;
  const Plan plan = scheme->make_plan(DType::kF32, numel, world, world, stats.empty() ? nullptr : stats.data(), ps, info);
  const BlockTable bt = make_blocks(plan, cfg.compressed_block_bytes());
  const Codec& codec = scheme->codec();
  RngCtx rng;
  rng.key = make_rng_key(cfg.seed, 1);
  rng.world = world;
  scheme->set_rng_flags(rng);
  Local local;
  local.bucket = x.data();
  // every block's message, as a peer's leaf compress writes it
  std::vector<std::vector<uint8_t>> msgs;
  std::vector<std::vector<uint8_t>> outs;
  int64_t elems = 0, wire = 0;
  for (const Block& b : bt.blocks) {
    if (b.empty()) continue;
    std::vector<uint8_t> m(codec.max_message_bytes(plan, b));
    m.resize(codec.compress(local, plan, b, rng, m.data()));
    wire += int64_t(m.size());
    elems += std::min(b.w1 * plan.unit, numel) - b.w0 * plan.unit;
    msgs.push_back(std::move(m));
    outs.emplace_back(codec.max_message_bytes(plan, b));
  }
  std::vector<float> y(x.size());
  Output o;
  o.bucket = y.data();
  o.bias_scale = float(world);
  CodecRow row;
  row.name = name;
  row.wire_bytes = double(wire) / double(elems);
  auto each = [&](const std::function<void(const Block&, size_t)>& f) {
    size_t i = 0;
    for (const Block& b : bt.blocks)
      if (!b.empty()) f(b, i++);
  };
  row.hop_ns = 1e9 / double(elems) * time_best([&] {
    each([&](const Block& b, size_t i) {
      codec.decompress_accumulate_recompress(msgs[i].data(), msgs[i].size(), local, plan, b, rng, outs[i].data());
    });
  }, min_s);
  row.leaf_ns = 1e9 / double(elems) * time_best([&] {
    each([&](const Block& b, size_t i) { codec.compress(local, plan, b, rng, outs[i].data()); });
  }, min_s);
  row.sink_ns = 1e9 / double(elems) * time_best([&] {
    each([&](const Block& b, size_t i) { codec.decompress(msgs[i].data(), msgs[i].size(), plan, b, o); });
  }, min_s);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t numel = argc > 1 ? std::atoll(argv[1]) : 4194304;
  const double min_s = argc > 2 ? std::atof(argv[2]) : 0.3;
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) x[size_t(i)] = nd(g) * std::ldexp(1.0f, int((i / 256) % 16) - 8);

  // checksums over 1 MiB messages (the default block)
  const size_t mb = size_t(1) << 20;
  std::vector<uint8_t> buf(mb);
  for (size_t i = 0; i < mb; ++i) buf[i] = uint8_t(g());
  struct Sum {
    const char* name;
    std::function<void()> fn;
  };
  std::vector<Sum> sums;
#ifdef HAVE_CRC32_INSN
  sums.push_back({"CRC32C, crc32 instruction, 1 stream", [&] { g_sink = crc32c_hw(buf.data(), mb); }});
  sums.push_back({"CRC32C, crc32 instruction, 3 streams", [&] {
                    uint32_t c[3];
                    crc32c_hw3(buf.data(), mb, c);
                    g_sink = c[0] ^ c[1] ^ c[2];
                  }});
#endif
  sums.push_back({"CRC32C, tables (slicing-by-8)", [&] { g_sink = crc32c_table(buf.data(), mb); }});
  sums.push_back({"XXH64", [&] { g_sink = xxh64(buf.data(), mb); }});
  // self-checks: the standard check values
  const char* nine = "123456789";
  if (crc32c_table(reinterpret_cast<const uint8_t*>(nine), 9) != 0xE3069283u) {
    std::fprintf(stderr, "CRC32C table check value wrong\n");
    return 1;
  }
#ifdef HAVE_CRC32_INSN
  if (crc32c_hw(buf.data(), mb) != crc32c_table(buf.data(), mb)) {
    std::fprintf(stderr, "CRC32C hw != table\n");
    return 1;
  }
#endif
  if (xxh64(nullptr, 0) != 0xEF46DB3751D8E999ull) {
    std::fprintf(stderr, "XXH64 check value wrong\n");
    return 1;
  }
  std::printf("checksum over 1 MiB | GB/s | ns per byte\n|---|---|---|\n");
  double best_ns_per_byte = 1e30;
  for (const Sum& s : sums) {
    const double t = time_best(s.fn, min_s);
    const double nspb = 1e9 * t / double(mb);
    best_ns_per_byte = std::min(best_ns_per_byte, nspb);
    std::printf("| %s | %.2f | %.3f |\n", s.name, double(mb) / t / 1e9, nspb);
  }
  // the one a message would use on this CPU: the fastest (hw CRC32C where there is one)
  const double crc_nspb = best_ns_per_byte;

  std::printf("\ncodec (float32, %lld elements, world 4) | wire bytes/element | hop ns/element | leaf | sink | "
              "checksum on the hop (send + receive) | of the hop's codec time\n|---|---|---|---|---|---|---|\n",
              (long long)numel);
  std::vector<std::pair<std::string, CollectiveConfig>> modes;
  CollectiveConfig c;
  c.mode = mode_id("dynamiq");
  modes.push_back({"dynamiq, bits 5 (correlated rounding)", c});
  c.params.set("rounding", (false) ? "correlated" : "independent");
  modes.push_back({"dynamiq, bits 5, independent rounding", c});
  c = CollectiveConfig{};
  c.mode = mode_id("lossless");
  modes.push_back({"lossless", c});
  c.mode = mode_id("bitsplit");
  c.params.set("bits", double(4));
  modes.push_back({"bitsplit, bits 4", c});
  c = CollectiveConfig{};
  modes.push_back({"none (identity)", c});
  for (const auto& [name, cfg] : modes) {
    const CodecRow r = time_codec(name, cfg, x, min_s);
    const double ck = 2.0 * r.wire_bytes * crc_nspb;
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f ns | %.0f %% |\n", r.name.c_str(), r.wire_bytes, r.hop_ns,
                r.leaf_ns, r.sink_ns, ck, 100.0 * ck / r.hop_ns);
  }
  return 0;
}
