#include "hook/collective/auto_mode.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <random>

#include "hook/collective/header_exchange.h"
#include "hook/collective/topology.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

// Header sums: [count, value] pairs (value scaled to an integer), so that a
// rank without a sample adds nothing and the mean is over those with one.
enum Slot : size_t {
  kBandwidth = 0,   // bytes/s
  kLatency = 2,     // ns
  kLossyLocal = 4,  // ps per element
  kLossyKernel = 6,
  kLossyBits = 8,   // 1e-6 bits
  kLosslessKernel = 10,
  kLosslessBits = 12,
  kCorrection = 14,  // 3 pairs, 1e-6
  kSlots = 20,
};
// A bucket of >= 1 MB: one whose time may update its mode's correction, and that
// counts towards (and may be) a re-probe.
bool big_bucket(int64_t numel, DType dtype) { return numel * int64_t(dtype_size(dtype)) >= (int64_t(1) << 20); }

static_assert(kSlots == kHeaderSums, "the header carries exactly mode auto's slots");
constexpr double kPs = 1e12, kMicro = 1e6;

void put(std::vector<int64_t>& v, size_t slot, bool have, double value) {
  if (!have || !std::isfinite(value) || value < 0) return;
  v[slot] = 1;
  v[slot + 1] = int64_t(std::llround(std::min(value, 4e18)));
}

// the mean of a slot over the ranks that reported it, else `keep`
double mean(const std::vector<int64_t>& s, size_t slot, double scale, double keep) {
  return s[slot] > 0 ? double(s[slot + 1]) / double(s[slot]) / scale : keep;
}

// A schedule's rounds on n ranks (its registry entry's cost).
double rounds(Topology t, int n) { return n <= 1 ? 0.0 : topology_def(t).rounds(n); }

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = d(g);
  return v;
}

}  // namespace

CodecCost calibrate_codec(const CollectiveConfig& cfg_in) {
  CollectiveConfig cfg = cfg_in;
  cfg.topology = kTopologyRing;
  cfg.seed = 0;
  cfg.local_size = 0;
  cfg.intra_mode = kModeNone;
  static std::mutex mu;
  static std::map<uint64_t, CodecCost> cache;
  const uint64_t key = cfg.fingerprint();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  constexpr int64_t kN = int64_t(1) << 20;
  CodecCost c;
  try {
    std::vector<CallStats> st(2);
    for (int rep = 0; rep < 2; ++rep) {  // the second run: buffers and pools warm
      InprocWorld world(2, std::chrono::seconds(60));
      world.run([&](int r, Transport& tr) {
        std::vector<float> x = gaussian(kN, 77u + uint32_t(r));
        CallArgs a;
        a.data = x.data();
        a.numel = kN;
        PlanState ps;
        a.plan_state = &ps;
        st[size_t(r)] = all_reduce(tr, cfg, a);
      });
    }
    for (const CallStats& s : st) {
      c.local = std::max(c.local, s.t_local / double(kN));
      c.kernel = std::max(c.kernel, (s.t_kernel + s.t_plan) / double(kN));
    }
    c.bits = st[0].bits_per_coord;
  } catch (const Error&) {
    c.kernel = 1.0;  // a mode that cannot run here is never chosen
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, c);
  return c;
}

std::vector<int64_t> AutoState::report() const {
  std::vector<int64_t> v(kSlots, 0);
  put(v, kBandwidth, my_bandwidth > 0, my_bandwidth);
  put(v, kLatency, my_latency > 0, my_latency * 1e9);
  put(v, kLossyLocal, calibrated, my_lossy.local * kPs);
  put(v, kLossyKernel, calibrated, my_lossy.kernel * kPs);
  put(v, kLossyBits, calibrated, my_lossy.bits * kMicro);
  put(v, kLosslessKernel, calibrated, my_lossless.kernel * kPs);
  put(v, kLosslessBits, calibrated, my_lossless.bits * kMicro);
  for (size_t i = 0; i < 3; ++i) put(v, kCorrection + 2 * i, my_correction[i] > 0, my_correction[i] * kMicro);
  return v;
}

void AutoState::absorb(const std::vector<int64_t>& s) {
  if (s.size() != kSlots) return;
  shared = true;
  bandwidth = mean(s, kBandwidth, 1.0, bandwidth);
  latency = mean(s, kLatency, 1e9, latency);
  lossy.local = mean(s, kLossyLocal, kPs, lossy.local);
  lossy.kernel = mean(s, kLossyKernel, kPs, lossy.kernel);
  lossy.bits = mean(s, kLossyBits, kMicro, lossy.bits);
  lossless.kernel = mean(s, kLosslessKernel, kPs, lossless.kernel);
  lossless.bits = mean(s, kLosslessBits, kMicro, lossless.bits);
  for (size_t i = 0; i < 3; ++i) correction[i] = mean(s, kCorrection + 2 * i, kMicro, correction[i]);
}

AutoState& inter_auto_state(AutoState& s) {
  if (!s.inter) s.inter = std::make_unique<AutoState>();
  return *s.inter;
}

AutoPrediction auto_predict(const AutoState& s, const CollectiveConfig& cfg, int n, int64_t numel, DType dtype) {
  AutoPrediction p;
  p.modes[0] = kModeNone;
  p.modes[1] = mode_id("lossless");
  p.modes[2] = cfg.auto_lossy;
  for (double& t : p.seconds) t = 0.0;
  const double bw = cfg.auto_bandwidth > 0 ? cfg.auto_bandwidth : s.bandwidth;
  if (n <= 1 || !s.shared || !(bw > 0) || numel < std::max<int64_t>(cfg.min_compress_numel, 1)) return p;
  const double lat = cfg.auto_latency >= 0 ? cfg.auto_latency : s.latency;
  const TopologyDef& topo = topology_def(cfg.topology);
  DQ_CHECK(!topo.composition(), "auto_predict: topology '" + topo.name + "' is a composition, not a schedule");
  const double es = dtype_size(dtype), N = double(numel), f = topo.bytes(n);
  const double R = rounds(cfg.topology, n), Rm = rounds(metadata_topology(cfg.topology, n), n);
  const double ll_bits = std::min(8.0 * es, s.lossless.bits * es / 4.0);
  p.seconds[0] = R * lat + f * N * es / bw;
  p.seconds[1] = R * lat + f * N * ll_bits / 8.0 / bw + f * N * s.lossless.kernel;
  p.seconds[2] = (R + Rm) * lat + f * N * s.lossy.bits / 8.0 / bw + N * s.lossy.local + f * N * s.lossy.kernel;
  for (int i = 0; i < 3; ++i) p.seconds[i] *= s.correction[i];
  p.predicted = true;
  for (int i = 1; i < 3; ++i)
    if (p.seconds[i] < p.seconds[p.choice]) p.choice = i;
  const int last = s.last_choice;
  if (last >= 0 && last != p.choice && p.seconds[p.choice] > (1.0 - kAutoHysteresis) * p.seconds[last])
    p.choice = last;
  if (big_bucket(numel, dtype)) {
    int probe = -1;
    for (int i = 0; i < 3; ++i)
      if (i != p.choice && s.since_run[i] >= kAutoReprobeBuckets &&
          p.seconds[i] <= kAutoReprobeSlack * p.seconds[p.choice] && (probe < 0 || p.seconds[i] < p.seconds[probe]))
        probe = i;
    if (probe >= 0) {
      p.choice = probe;
      p.reprobe = true;
    }
  }
  return p;
}

CallStats auto_all_reduce(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a) {
  DQ_CHECK(cfg.mode == kModeAuto, "auto_all_reduce: mode is not auto");
  AutoState fresh;
  AutoState& st = a.auto_state ? *a.auto_state : fresh;
  if (!st.calibrated) {
    CollectiveConfig c = cfg;
    c.mode = cfg.auto_lossy;
    st.my_lossy = calibrate_codec(c);
    c.mode = mode_id("lossless");
    c.params = ParamSet();  // (the parameters are auto_lossy's)
    st.my_lossless = calibrate_codec(c);
    if (a.device) {  // device kernels: not measured, counted as free (the wire decides)
      st.my_lossy.local = st.my_lossy.kernel = 0.0;
      st.my_lossless.local = st.my_lossless.kernel = 0.0;
    }
    st.calibrated = true;
  }
  if (st.calls == 0) {
    // The group's first bucket: share the calibration before deciding, in a header
    // (mode auto, this call's fields) and not a bare all-reduce of the numbers, so
    // that a rank running another mode meets a header of the same length and every
    // rank raises "ranks disagree on mode" instead of hanging.
    const std::vector<int64_t> v = st.report();
    AutoExchange probe;
    probe.fingerprint = cfg.fingerprint();
    CallArgs pa = a;
    pa.auto_state = nullptr;
    pa.auto_exchange = &probe;
    HeaderReport rep;
    rep.kind = a.kind;
    rep.sums = &v;
    const HeaderVerdict hv = exchange_header(tr, collective_header_fields(cfg, pa, 0), rep);
    if (!hv.error.empty()) throw Error(hv.error);
    st.absorb(hv.sums);
  }
  const AutoPrediction p = auto_predict(st, cfg, tr.size(), a.numel, a.dtype);
  CollectiveConfig c = cfg;
  c.mode = p.modes[p.choice];
  if (c.mode != cfg.auto_lossy) c.params = ParamSet();  // (the parameters are auto_lossy's)
  AutoExchange ex;
  ex.local = st.report();
  ex.fingerprint = cfg.fingerprint();
  CallArgs b = a;
  b.auto_state = nullptr;
  b.auto_exchange = &ex;
  const double corr_used = st.correction[p.choice];
  CallStats cs = all_reduce(tr, c, b);
  st.calls += 1;
  if (p.predicted && !p.reprobe) st.last_choice = p.choice;  // a re-probe does not move the hysteresis
  if (p.predicted && big_bucket(a.numel, a.dtype)) {
    for (int64_t& k : st.since_run) k += 1;
    st.since_run[p.choice] = 0;
  }
  st.absorb(ex.sums);
  // this rank's samples, shared with the next bucket's header
  if (cs.slices == 1 && cs.t_header > 0)
    st.my_latency = st.my_latency > 0 ? std::min(st.my_latency, cs.t_header) : cs.t_header;
  const bool big = cs.bytes_sent >= (int64_t(1) << 20);
  if (c.mode == kModeNone && cs.path == Path::kExactMode && big) {
    const double exec = cs.t_total - cs.t_header - cs.t_local - cs.t_meta - cs.t_plan;
    if (exec > 0) st.my_bandwidth = double(cs.bytes_sent) / exec;
  }
  if (p.predicted && big && corr_used > 0) {
    const double raw = p.seconds[p.choice] / corr_used;
    if (raw > 0) st.my_correction[p.choice] = cs.t_total / raw;
  }
  cs.auto_choice = int32_t(c.mode);
  cs.auto_reprobe = p.reprobe;
  for (int i = 0; i < 3; ++i) cs.auto_predicted[i] = p.seconds[i];
  return cs;
}

}  // namespace dynamiq
