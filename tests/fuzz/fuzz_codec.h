// The codec harness shared by fuzz_codec_{dynamiq,lossless,bitsplit,bounded,identity}.cc: a plan
// made as a collective makes it (the mode's scheme, the plan from real statistics of a
// deterministic bucket, the block table), one block of it, and one receiving role of the
// codec run on the fuzzed bytes as that block's message:
//   decompress (all-gather receiver and sink), decompress_accumulate from the bucket or
//   from a float accumulator, the fused hop decompress_accumulate_recompress, and
//   dynamic_bytes on the received static part (as the executor calls it first).
//
// Input: a kPrefix-byte parameter prefix (CodecCase::decode), then the message.
//   p[0]  bits 0-1 role (RecvRole); bit 2 op mean (divisor = world); bit 3 the message is
//         cut or zero-padded to the size the plan expects (static part, plus for a
//         two-part codec the dynamic size its header announces, capped at the bound), so
//         that most inputs reach the decoder rather than the size check; bit 4 (lossless)
//         rewrite the header's CRC-16 over the mutated header, so that mutations of the
//         header fields get past the checksum to the checks behind it
//   p[1]  dtype (mod 3); (p[1] / 3) % 4 the style of the rank's own values (fill_values)
//   p[2..3] numel = 1 + u16 % 6144
//   p[4]  world = 2 + p[4] % 7 (one chunk per rank); p[5] rank (mod world)
//   p[6]  block (mod the number of non-empty blocks)
//   p[7]  block_bytes = 64 << (p[7] % 12)
//   p[8..15] mode parameters (see config_of)
//   p[16..23] seed of the rank's own values and of the rounding key
//
// Properties checked besides "no crash, no UB, no leak, no hang": a decode ends in
// MalformedMessage or returns; dynamic_bytes never exceeds max_dynamic_bytes; the fused hop
// writes at most max_message_bytes (fixed-size codecs: exactly static_bytes) and what it
// writes is itself a valid message (decompress reads it back without an exception), i.e.
// a rank never forwards bytes its peers would reject; a plan made from real statistics
// for a config make_scheme accepts never throws.
#pragma once

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "fuzz_util.h"
#include "../cpp/params_util.h"
#include "hook/collective/config.h"
#include "hook/collective/schedule.h"
#include "hook/collective/topology.h"
#include "kernels/dynamiq/dynamiq_stats.h"
#include "kernels/lossless/lossless_format.h"
#include "kernels/scheme.h"

namespace dqfuzz {

constexpr size_t kCodecPrefix = 24;

enum class RecvRole : uint8_t { kDecompress = 0, kAccumulateBucket = 1, kAccumulateAcc = 2, kFusedHop = 3 };

struct CodecCase {
  Mode mode = kModeNone;
  RecvRole role = RecvRole::kDecompress;
  bool mean = false, fix_size = false, fix_crc = false;
  DType dtype = DType::kF32;
  int style = 0;
  int64_t numel = 1;
  int world = 2, rank = 0;
  int block = 0;
  int64_t block_bytes = 64;
  uint8_t mode_params[8] = {};
  uint64_t seed = 0;

  static CodecCase decode(Mode mode, const uint8_t* p) {
    CodecCase c;
    c.mode = mode;
    c.role = RecvRole(p[0] & 3);
    c.mean = (p[0] >> 2) & 1;
    c.fix_size = (p[0] >> 3) & 1;
    c.fix_crc = (p[0] >> 4) & 1;
    c.dtype = DType(p[1] % 3);
    c.style = (p[1] / 3) % 4;
    c.numel = 1 + (int64_t(p[2] | (p[3] << 8)) % 6144);
    c.world = 2 + p[4] % 7;
    c.rank = p[5] % c.world;
    c.block = p[6];
    c.block_bytes = int64_t(64) << (p[7] % 12);
    std::memcpy(c.mode_params, p + 8, 8);
    std::memcpy(&c.seed, p + 16, 8);
    return c;
  }
  // The inverse of decode for values in range (the corpus generator writes prefixes).
  void encode(uint8_t* p) const {
    p[0] = uint8_t(int(role) | (mean << 2) | (fix_size << 3) | (fix_crc << 4));
    p[1] = uint8_t(int(dtype) + 3 * style);
    const uint16_t nm = uint16_t((numel - 1) % 6144);
    p[2] = uint8_t(nm), p[3] = uint8_t(nm >> 8);
    p[4] = uint8_t(world - 2);
    p[5] = uint8_t(rank);
    p[6] = uint8_t(block);
    int k = 0;
    while ((int64_t(64) << k) < block_bytes && k < 11) ++k;
    p[7] = uint8_t(k);
    std::memcpy(p + 8, mode_params, 8);
    std::memcpy(p + 16, &seed, 8);
  }
};

// The registered schedule (all-reduce) a parameter byte picks, by id: with the
// built-in topologies ring 0, butterfly 1, twostep 2, as the corpus was recorded.
inline Topology topology_of(uint8_t b) {
  static const std::vector<Topology> t = schedule_topologies();
  return t[b % t.size()];
}

// The collective config of a case. Mode parameters (p = mode_params):
//   dynamiq:  bits = 1.5 + p[0] / 16 (1.5 .. 17.4); widths mask from p[1]'s low 5 bits over
//             {1, 2, 4, 8, 16} (0: the default {2, 4, 8}); group size {16, 8, 32, 64}[p[2] % 4];
//             super-group size {256, 64, 128, 512}[(p[2] / 4) % 4]; p[3]: bit 0 flat scales,
//             bit 1 uniform levels, bit 2 exact allocator, bit 3 independent rounding, bit 4
//             custom eps for widths 4 and 8 from p[4], p[5] (/ 256)
//   bitsplit: bits = 2 + p[0] % 7; group {0 (default), 32, 64, 96, 128, 256}[p[1] % 6];
//             spike_reserve p[2] % 3 - 1; p[3]: bit 0 log scales, bit 1 nearest rounding
//   bounded:  p[0] bit 0 relative bound: error_bound_rel = (1 + p[1]) / 256 x 2^-(p[2] % 24);
//             else error_bound = (1 + p[1] / 256) x 2^(p[2] % 96 - 80) (2^-80 .. 2^15)
//   lossless, none: nothing
inline CollectiveConfig config_of(const CodecCase& c) {
  CollectiveConfig cfg;
  cfg.mode = c.mode;
  cfg.seed = c.seed;
  const uint8_t* p = c.mode_params;
  if (c.mode == mode_id("dynamiq")) {
    cfg.params.set("bits", double(1.5 + p[0] / 16.0));
    static const int kW[5] = {1, 2, 4, 8, 16};
    uint32_t mask = 0;
    for (int i = 0; i < 5; ++i)
      if ((p[1] >> i) & 1) mask |= 1u << kW[i];
    if (mask) cfg.params.set("widths", widths_of(mask));
    static const int kS[4] = {16, 8, 32, 64};
    static const int kSG[4] = {256, 64, 128, 512};
    cfg.params.set("group_size", double(kS[p[2] % 4]));
    cfg.params.set("supergroup_size", double(kSG[(p[2] / 4) % 4]));
    cfg.params.set("hierarchical_scales", double(!(p[3] & 1)));
    cfg.params.set("uniform_levels", double((p[3] & 2) != 0));
    cfg.params.set("allocator", (p[3] & 4) ? "exact" : "fast");
    cfg.params.set("rounding", (!(p[3] & 8)) ? "correlated" : "independent");
    if (p[3] & 16) cfg.params.set("eps", std::vector<double>{-1, -1, p[4] / 256.0, p[5] / 256.0});
  } else if (c.mode == mode_id("bitsplit")) {
    cfg.params.set("bits", double(2 + p[0] % 7));
    static const int kG[6] = {0, 32, 64, 96, 128, 256};
    cfg.params.set("group_size", double(kG[p[1] % 6]));
    set_spike_reserve(cfg.params, p[2] % 3 - 1);
    cfg.params.set("log_scales", double(p[3] & 1));
    cfg.params.set("rounding", (!(p[3] & 2)) ? "stochastic" : "nearest");
  } else if (c.mode == mode_id("bounded")) {
    if (p[0] & 1)
      cfg.params.set("error_bound_rel", double((1.0 + p[1]) / 256.0 * std::ldexp(1.0, -(p[2] % 24))));
    else
      cfg.params.set("error_bound", double((1.0 + p[1] / 256.0) * std::ldexp(1.0, p[2] % 96 - 80)));
  }
  return cfg;
}

// Everything a receiving rank has for one block: scheme (its codec), plan, block, its own
// values, the rounding context.
struct CodecSetup {
  std::shared_ptr<const Scheme> scheme;  // shared with the scheme cache, which may drop it
  Plan plan;
  Block block;
  std::vector<uint8_t> bucket;  // the rank's own values, numel elements
  RngCtx rng;
  Output out;
  const Codec& codec() const { return scheme->codec(); }
};

// Builds the setup of a case; false when the case is not one a collective would run
// (config rejected by make_scheme, a bucket that takes an exact path, no non-empty block).
// Schemes are immutable once made (make_plan is const) and making one builds the codec's
// tables, so they are kept per config (by fingerprint; at most 256, then all dropped).
inline std::shared_ptr<const Scheme> cached_scheme(const CollectiveConfig& cfg) {
  static std::map<uint64_t, std::shared_ptr<const Scheme>> cache;
  const uint64_t key = cfg.fingerprint();
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 256) cache.clear();
  std::shared_ptr<const Scheme> sc;
  try {
    sc = make_scheme(cfg);
  } catch (const Error&) {
    sc = nullptr;  // a config the Python API would reject up front (cached as such)
  }
  return cache.emplace(key, std::move(sc)).first->second;
}

inline bool make_setup(const CodecCase& c, CodecSetup& s) {
  const CollectiveConfig cfg = config_of(c);
  s.scheme = cached_scheme(cfg);
  if (!s.scheme) return false;
  if (!s.scheme->fits_budget(c.numel)) return false;  // the exact-budget path
  const size_t es = size_t(dtype_size(c.dtype));
  s.bucket.assign(size_t(c.numel) * es, 0);
  fill_values(s.bucket.data(), c.dtype, c.numel, c.seed, c.style, s.scheme->exact());
  // The all-reduced statistics as if every rank held these values.
  std::vector<float> stats(size_t(s.scheme->stats_count(c.dtype, c.numel)));
  if (!stats.empty()) {
    if (s.scheme->local_pass(s.bucket.data(), c.dtype, c.numel, stats.data()))
      return false;  // non-finite: the exact path
    for (float& f : stats) f *= float(c.world);
  }
  PlanState ps;
  PlanInfo info;
  try {
    s.plan = s.scheme->make_plan(c.dtype, c.numel, c.world, c.world, stats.empty() ? nullptr : stats.data(),
                                 ps, info);
  } catch (const std::exception& e) {
    fail(std::string("make_plan threw on real statistics for an accepted config: ") + e.what());
  }
  const BlockTable bt = make_blocks(s.plan, c.block_bytes);
  std::vector<Block> nonempty;
  for (const Block& b : bt.blocks)
    if (!b.empty()) nonempty.push_back(b);
  if (nonempty.empty()) return false;
  s.block = nonempty[size_t(c.block) % nonempty.size()];
  s.rng.key = make_rng_key(cfg.seed, 1);
  s.rng.rank = c.rank;
  s.rng.world = c.world;
  s.scheme->set_rng_flags(s.rng);
  s.out.bias_scale = float(c.world);
  s.out.divisor = c.mean ? float(c.world) : 1.0f;
  return true;
}

// The accumulator of a block in wire order, filled with finite values from the bucket.
inline std::vector<float> make_acc(const CodecSetup& s) {
  const Plan& plan = s.plan;
  std::vector<float> acc(size_t(s.block.units()) * size_t(plan.unit), 0.0f);
  for (int64_t w = s.block.w0; w < s.block.w1; ++w) {
    const int64_t src = plan.src_unit(w);
    const int64_t n = plan.unit_elem_count(src);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = plan.unit_elem_begin(src) + i;
      float v = 0.0f;
      switch (plan.dtype) {
        case DType::kF32: std::memcpy(&v, s.bucket.data() + 4 * e, 4); break;
        case DType::kBF16: v = bf16_to_f32(reinterpret_cast<const uint16_t*>(s.bucket.data())[e]); break;
        case DType::kF16: v = f16_to_f32(reinterpret_cast<const uint16_t*>(s.bucket.data())[e]); break;
      }
      acc[size_t((w - s.block.w0) * plan.unit + i)] = v - plan.unit_bias(src);
    }
  }
  return acc;
}

// The expected size of a message (fix_size): the static part, plus the dynamic size its
// header announces when the codec has one (capped at the bound; the header is read only if
// the static part is there).
inline size_t expected_size(const CodecSetup& s, const uint8_t* msg, size_t n) {
  const Codec& codec = s.codec();
  const size_t sb = codec.static_bytes(s.plan, s.block);
  const size_t maxd = codec.max_dynamic_bytes(s.plan, s.block);
  if (maxd == 0) return sb;
  if (n < 12) return sb + maxd;
  uint32_t d;
  std::memcpy(&d, msg + 8, 4);  // lossless header: dynamic_bytes at [8, 12)
  return sb + std::min<size_t>(d, maxd);
}

// The setup of a prefix, made once: the fuzzer mutates the message far more often than the
// prefix, and a setup (values, statistics, plan) costs far more than most decodes. Null: not a
// runnable case. At most 128 kept, then all dropped.
inline const CodecSetup* cached_setup(Mode mode, const uint8_t* prefix) {
  static std::map<std::pair<int, std::string>, std::unique_ptr<CodecSetup>> cache;
  auto key = std::make_pair(int(mode), std::string(reinterpret_cast<const char*>(prefix), kCodecPrefix));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  if (cache.size() >= 128) cache.clear();
  auto s = std::make_unique<CodecSetup>();
  if (!make_setup(CodecCase::decode(mode, prefix), *s)) s.reset();
  return cache.emplace(std::move(key), std::move(s)).first->second.get();
}

// Runs one case on the fuzzed message. Returns 0 (libFuzzer's convention).
inline int run_codec_case(Mode mode, const uint8_t* data, size_t size) {
  Input<kCodecPrefix> in(data, size);
  const CodecCase c = CodecCase::decode(mode, in.p);
  const CodecSetup* sp = cached_setup(mode, in.p);
  if (!sp) return 0;
  const CodecSetup& s = *sp;
  const Codec& codec = s.codec();
  const Plan& plan = s.plan;
  const Block& b = s.block;

  std::vector<uint8_t> raw(in.rest, in.rest + in.rest_bytes);
  if (c.fix_size) raw.resize(expected_size(s, raw.data(), raw.size()), 0);
  if (c.fix_crc && mode == mode_id("lossless") && raw.size() >= size_t(lossless::kHeaderBytes)) {
    const uint16_t crc = lossless::crc16(raw.data(), lossless::kHeaderBytes - 2);
    std::memcpy(raw.data() + lossless::kHeaderBytes - 2, &crc, 2);
  }
  ExactBuffer msg(raw.data(), raw.size());

  const size_t sb = codec.static_bytes(plan, b);
  const size_t maxd = codec.max_dynamic_bytes(plan, b);
  const size_t max_msg = codec.max_message_bytes(plan, b);
  try {
    // What the executor does first with a received static part.
    if (msg.size() >= sb) {
      ExactBuffer static_part(msg.data(), sb);
      const size_t d = codec.dynamic_bytes(static_part.data(), plan, b);
      FUZZ_CHECK(d <= maxd, codec.name() + ": dynamic_bytes " + std::to_string(d) + " > bound " +
                                std::to_string(maxd));
    }
    switch (c.role) {
      case RecvRole::kDecompress: {
        ExactBuffer y(s.bucket.data(), s.bucket.size());
        Output o = s.out;
        o.bucket = y.data();
        codec.decompress(msg.data(), msg.size(), plan, b, o);
        break;
      }
      case RecvRole::kAccumulateBucket:
      case RecvRole::kAccumulateAcc: {
        std::vector<float> acc_in = make_acc(s);
        ExactBuffer acc(acc_in.size() * sizeof(float));
        std::memcpy(acc.data(), acc_in.data(), acc.size());
        Local x;
        if (c.role == RecvRole::kAccumulateBucket) {
          x.bucket = s.bucket.data();
        } else {
          x.acc = reinterpret_cast<const float*>(acc.data());  // aliases the output, as the executor may
          x.acc_w0 = b.w0;
        }
        codec.decompress_accumulate(msg.data(), msg.size(), x, plan, b, reinterpret_cast<float*>(acc.data()));
        break;
      }
      case RecvRole::kFusedHop: {
        ExactBuffer out(max_msg);
        Local x;
        x.bucket = s.bucket.data();
        const size_t n = codec.decompress_accumulate_recompress(msg.data(), msg.size(), x, plan, b, s.rng,
                                                                out.data());
        FUZZ_CHECK(n <= max_msg, codec.name() + ": fused hop wrote " + std::to_string(n) + " > " +
                                     std::to_string(max_msg));
        if (maxd == 0) FUZZ_CHECK(n == sb, codec.name() + ": fixed-size message of " + std::to_string(n));
        // What this rank forwards must be a message its peers accept.
        ExactBuffer fwd(out.data(), n);
        ExactBuffer y(s.bucket.size());
        Output o = s.out;
        o.bucket = y.data();
        try {
          codec.decompress(fwd.data(), fwd.size(), plan, b, o);
        } catch (const std::exception& e) {
          fail(codec.name() + ": the fused hop's own output does not decode: " + e.what());
        }
        break;
      }
    }
  } catch (const MalformedMessage&) {
    // the documented end of a bad message
  } catch (const std::exception& e) {
    fail(codec.name() + ": a received message raised something other than MalformedMessage: " + e.what());
  }
  return 0;
}

}  // namespace dqfuzz
