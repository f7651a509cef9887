// Wire-format golden: the bytes every mode puts on the wire, recorded once and
// checked on every build (every ISA, thread count, the portable aarch64 build
// and the sanitizer build). For each mode, config and dtype it drives the
// scheme as the collective driver does (local pass -> plan over 3 chunks ->
// per chunk: compress, the fused hop onto a second rank's data, the final
// decompress) and compares the size and FNV-1a hash of each message with
// tests/golden/wire.txt. A change of the wire format must be deliberate:
// regenerate with DYNAMIQ_UPDATE_GOLDEN=1 and say why in CHANGELOG.md.
//
// The input data is built from integers and powers of two only (no libm), so
// it is the same on every platform.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "hook/collective/config.h"
#include "kernels/registry.h"
#include "kernels/base/float_bits.h"
#include "params_util.h"

#ifndef DYNAMIQ_GOLDEN_DIR
#error "DYNAMIQ_GOLDEN_DIR must name tests/golden"
#endif

namespace dynamiq {
namespace {

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Gradient-like float32 values: per-"layer" power-of-two scales over 2^-20..2^3,
// a few spikes, a run of zeros, a super-group of equal values.
std::vector<float> make_values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed;
  int exp = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 700 == 0) exp = int(splitmix(s) % 24) - 20;
    const int64_t q = int64_t(splitmix(s) % 4001) - 2000;  // [-2000, 2000]
    float x = std::ldexp(float(q) / 2000.0f, exp);
    if (splitmix(s) % 997 == 0) x *= 64.0f;  // spike
    v[size_t(i)] = x;
  }
  for (int64_t i = 1024; i < 1024 + 300 && i < n; ++i) v[size_t(i)] = 0.0f;
  for (int64_t i = 2048; i < 2048 + 256 && i < n; ++i) v[size_t(i)] = 0.375f;
  return v;
}

std::vector<uint8_t> as_dtype(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> out(v.size() * size_t(dtype_size(dt)));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dt == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

struct Case {
  std::string name;
  CollectiveConfig cfg;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](const std::string& name, Mode m, auto&& edit) {
    Case c;
    c.name = name;
    c.cfg.mode = m;
    c.cfg.seed = 1234;
    edit(c.cfg);
    v.push_back(c);
  };
  auto same = [](CollectiveConfig&) {};
  add("none", mode_id("none"), same);
  add("lossless", mode_id("lossless"), same);
  add("dynamiq.b5", mode_id("dynamiq"), same);
  add("dynamiq.b3", mode_id("dynamiq"), [](CollectiveConfig& c) { c.params.set("bits", double(3.0)); });
  add("dynamiq.b8.exact", mode_id("dynamiq"), [](CollectiveConfig& c) { c.params.set("bits", double(8.0)); c.params.set("allocator", (true) ? "exact" : "fast"); });
  add("dynamiq.b4.w1248_16", mode_id("dynamiq"), [](CollectiveConfig& c) {
    c.params.set("bits", double(4.0));
    c.params.set("widths", widths_of((1u << 1) | (1u << 2) | (1u << 4) | (1u << 8) | (1u << 16)));
  });
  add("dynamiq.b5.independent", mode_id("dynamiq"), [](CollectiveConfig& c) { c.params.set("rounding", (false) ? "correlated" : "independent"); });
  add("dynamiq.b5.flat_uniform", mode_id("dynamiq"), [](CollectiveConfig& c) {
    c.params.set("hierarchical_scales", double(false));
    c.params.set("uniform_levels", double(true));
  });
  add("dynamiq.b5.s128g8", mode_id("dynamiq"), [](CollectiveConfig& c) {
    c.params.set("supergroup_size", double(128));
    c.params.set("group_size", double(8));
    c.params.set("eps", std::vector<double>{-1.f, 0.2f, 0.3f, 0.05f});
  });
  for (int b : {2, 3, 4, 8})
    add("bitsplit.b" + std::to_string(b), mode_id("bitsplit"), [b](CollectiveConfig& c) { c.params.set("bits", double(b)); });
  add("bitsplit.b4.nearest_log_g32_spikes", mode_id("bitsplit"), [](CollectiveConfig& c) {
    c.params.set("bits", double(4));
    c.params.set("rounding", (false) ? "stochastic" : "nearest");
    c.params.set("log_scales", double(true));
    c.params.set("group_size", double(32));
    set_spike_reserve(c.params, 1);
  });
  add("bounded.abs1e-3", mode_id("bounded"), [](CollectiveConfig& c) { c.params.set("error_bound", double(1e-3)); });
  add("bounded.abs0.25", mode_id("bounded"), [](CollectiveConfig& c) { c.params.set("error_bound", double(0.25)); });
  add("bounded.rel1e-4", mode_id("bounded"), [](CollectiveConfig& c) { c.params.set("error_bound_rel", double(1e-4)); });
  return v;
}

// One record per message: "name bytes hash".
std::map<std::string, std::string> compute() {
  std::map<std::string, std::string> rec;
  const int world = 3;
  const int64_t numel = 5000 + 37;  // not a multiple of any unit
  const std::vector<float> v0 = make_values(numel, 11), v1 = make_values(numel, 22);
  auto put = [&](const std::string& k, const uint8_t* p, size_t n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%zu %016llx", n, static_cast<unsigned long long>(fnv1a(p, n)));
    rec[k] = buf;
  };
  for (const Case& c : cases()) {
    char fp[32];
    std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(c.cfg.fingerprint()));
    rec[c.name + ".fingerprint"] = fp;
    const auto scheme = make_scheme(c.cfg);
    const Codec& codec = scheme->codec();
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::vector<uint8_t> b0 = as_dtype(v0, dt), b1 = as_dtype(v1, dt);
      const std::string base = c.name + "." + dtype_name(dt);
      // The global statistics as the sum of two ranks' local ones, as the
      // metadata all-reduce would give.
      const int64_t ns = scheme->stats_count(dt, numel);
      std::vector<float> s0(static_cast<size_t>(ns)), s1(static_cast<size_t>(ns));
      scheme->local_pass(b0.data(), dt, numel, s0.data());
      scheme->local_pass(b1.data(), dt, numel, s1.data());
      for (int64_t i = 0; i < ns; ++i) s0[size_t(i)] += s1[size_t(i)];
      PlanState st;
      PlanInfo info;
      const Plan plan = scheme->make_plan(dt, numel, world, world, s0.data(), st, info);
      std::vector<uint8_t> order_bytes;
      for (int64_t w = 0; w < plan.num_units; ++w) {
        const int64_t s = plan.src_unit(w);
        order_bytes.push_back(uint8_t(s));
        order_bytes.push_back(uint8_t(s >> 8));
        order_bytes.push_back(plan.bits.empty() ? 0 : plan.bits[size_t(s)]);
      }
      put(base + ".plan", order_bytes.data(), order_bytes.size());
      for (int ch = 0; ch < plan.num_chunks(); ++ch) {
        const Block blk{plan.chunk_begin[size_t(ch)], plan.chunk_begin[size_t(ch) + 1]};
        if (blk.empty()) continue;
        const std::string k = base + ".chunk" + std::to_string(ch);
        RngCtx r;
        r.key = make_rng_key(c.cfg.seed, 7 + uint64_t(ch));
        r.world = world;
        scheme->set_rng_flags(r);
        r.rank = 1;
        Local x0;
        x0.bucket = b0.data();
        std::vector<uint8_t> m0(codec.max_message_bytes(plan, blk));
        m0.resize(codec.compress(x0, plan, blk, r, m0.data()));
        put(k + ".compress", m0.data(), m0.size());
        // the next rank's fused hop
        r.rank = 2;
        Local x1;
        x1.bucket = b1.data();
        std::vector<uint8_t> m1(codec.max_message_bytes(plan, blk));
        m1.resize(codec.decompress_accumulate_recompress(m0.data(), m0.size(), x1, plan, blk, r, m1.data()));
        put(k + ".hop", m1.data(), m1.size());
        // the final values of the chunk, as the sink writes them (mean over 2)
        std::vector<uint8_t> out(b0.size(), 0);
        Output y;
        y.bucket = out.data();
        y.bias_scale = 2.0f;
        y.divisor = 2.0f;
        codec.decompress(m1.data(), m1.size(), plan, blk, y);
        put(k + ".decompress", out.data(), out.size());
      }
    }
  }
  return rec;
}

const char* kGoldenPath = DYNAMIQ_GOLDEN_DIR "/wire.txt";

// The record: name -> "bytes hash" (empty when the file is missing).
std::map<std::string, std::string> read_golden() {
  std::ifstream f(kGoldenPath);
  std::map<std::string, std::string> want;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    want[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return want;
}

// A built-in codec cannot skip the record: every built-in registered mode (ModeInfo::builtin)
// has a case above, and every case has recorded lines ("<case>.<dtype>...", "<case>.fingerprint").
// (Test-only codecs are not recorded: their bytes are no format anyone keeps.)
TEST(WireGolden, EveryBuiltinModeHasRecordedLines) {
  const std::map<std::string, std::string> want = read_golden();
  ASSERT_FALSE(want.empty()) << "missing " << kGoldenPath;
  const std::vector<Case> all = cases();
  for (const ModeInfo& m : registered_modes()) {
    if (!m.builtin) continue;
    int n_cases = 0;
    for (const Case& c : all) {
      if (c.cfg.mode != m.id) continue;
      ++n_cases;
      const std::string prefix = c.name + ".";
      const auto it = want.lower_bound(prefix);
      EXPECT_TRUE(it != want.end() && it->first.compare(0, prefix.size(), prefix) == 0)
          << "case " << c.name << " of mode " << m.name << " has no line in " << kGoldenPath;
    }
    EXPECT_GT(n_cases, 0) << "built-in mode " << m.name << " has no wire golden case (add it to cases())";
  }
}

TEST(WireGolden, EveryModesMessagesAreByteIdenticalToTheRecord) {
  const auto rec = compute();
  ASSERT_GT(rec.size(), 100u);
  if (const char* u = std::getenv("DYNAMIQ_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream f(kGoldenPath);
    f << "# name bytes fnv1a64 (tests/cpp/test_wire_golden.cc; DYNAMIQ_UPDATE_GOLDEN=1 rewrites)\n";
    for (const auto& [k, v] : rec) f << k << ' ' << v << '\n';
    ASSERT_TRUE(f.good()) << kGoldenPath;
    GTEST_SKIP() << "rewrote " << kGoldenPath;
  }
  std::ifstream f(kGoldenPath);
  ASSERT_TRUE(f.good()) << "missing " << kGoldenPath;
  const std::map<std::string, std::string> want = read_golden();
  int diffs = 0;
  for (const auto& [k, v] : want) {
    auto it = rec.find(k);
    if (it == rec.end()) {
      ADD_FAILURE() << k << ": recorded, no longer produced";
      ++diffs;
    } else if (it->second != v) {
      if (++diffs <= 20) ADD_FAILURE() << k << ": recorded " << v << ", now " << it->second;
    }
  }
  for (const auto& [k, v] : rec)
    if (!want.count(k)) ADD_FAILURE() << k << ": produced, not recorded";
  EXPECT_EQ(diffs, 0) << "messages differ from " << kGoldenPath;
}

}  // namespace
}  // namespace dynamiq
