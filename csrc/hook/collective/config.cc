#include "hook/collective/config.h"

#include <cstring>
#include <sstream>

#include "hook/collective/topology.h"
#include "kernels/registry.h"
#include "kernels/scheme.h"

namespace dynamiq {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all-reduce";
    case Collective::kReduceScatter: return "reduce-scatter";
    case Collective::kAllGather: return "all-gather";
  }
  return "?";
}

namespace {
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  template <typename T>
  void add(const T& v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (unsigned char c : b) {
      h ^= c;
      h *= 1099511628211ull;
    }
  }
};

// The codec values every fingerprint has carried since version 1, in this order, whatever the
// mode: they predate per-mode parameters. A mode that does not declare one (mode none and bits,
// dynamiq and log_scales, ...) encodes the value version 1 had for it by default, so every
// configuration keeps the fingerprint it had (tests/golden/fingerprints.txt). Frozen: a parameter
// declared later enters after the driver's fields, by name (fingerprint() below).
const char* const kV1CodecNames[] = {"bits",          "widths",        "allocator",      "rounding",
                                     "group_size",    "supergroup_size", "spike_reserve", "log_scales",
                                     "eps",           "uniform_levels", "hierarchical_scales",
                                     "error_bound",   "error_bound_rel"};

bool in_v1_layout(const std::string& name) {
  for (const char* n : kV1CodecNames)
    if (name == n) return true;
  return false;
}

void add_v1_codec_values(Fnv& f, const ParamSet& p) {
  f.add(p.num_or("bits", 5.0));
  uint32_t widths = (1u << 2) | (1u << 4) | (1u << 8);
  if (p.has("widths")) {
    widths = 0;
    for (double w : p.list("widths")) widths |= 1u << int(w);
  }
  f.add(widths);
  f.add(uint8_t(p.has("allocator") && p.str("allocator") == "exact"));
  const std::string rounding = p.has("rounding") ? p.str("rounding") : std::string();
  f.add(uint8_t(rounding != "independent"));  // v1's `correlated`
  f.add(uint8_t(rounding != "nearest"));      // v1's `stochastic`
  f.add(int32_t(p.num_or("group_size", 0)));  // unset: 0
  f.add(int32_t(p.num_or("supergroup_size", 256)));
  f.add(int32_t(p.has("spike_reserve") ? int(p.flag("spike_reserve")) : -1));  // unset: -1
  f.add(uint8_t(p.has("log_scales") && p.flag("log_scales")));
  for (int i = 0; i < 4; ++i) f.add(p.has("eps") ? float(p.list("eps")[size_t(i)]) : -1.0f);  // unset: -1 each
  f.add(uint8_t(p.has("uniform_levels") && p.flag("uniform_levels")));
  f.add(uint8_t(!p.has("hierarchical_scales") || p.flag("hierarchical_scales")));
}

void add_param(Fnv& f, const ParamDecl& d, const ParamValue& v) {
  for (char c : d.name) f.add(c);
  f.add(uint8_t(0));
  f.add(uint8_t(d.type));
  f.add(v.num);
  for (char c : v.str) f.add(c);
  f.add(uint64_t(v.list.size()));
  for (double x : v.list) f.add(x);
}

}  // namespace

uint64_t CollectiveConfig::fingerprint() const {
  // the parameters as the codec will run them: defaults filled in (a default that changes
  // changes the fingerprint). An unknown mode fingerprints what was given.
  // A config whose parameters its mode refuses fingerprints what was given: it never runs (the
  // header exchange reports make_scheme's error on every rank), and this must not throw.
  const bool known = mode_is_registered(codec_mode());
  ParamSet p = params;
  if (known) {
    try {
      p = resolve_params(mode_params(codec_mode()), params, mode_name(codec_mode()));
    } catch (const Error&) {
    }
  }
  Fnv f;
  f.add(uint32_t(1));  // encoding version
  f.add(uint8_t(mode));
  f.add(uint8_t(topology));
  f.add(seed);
  add_v1_codec_values(f, p);
  f.add(block_bytes);
  f.add(min_compress_numel);
  if (max_collective_bytes != (int64_t(256) << 20)) f.add(max_collective_bytes);  // default: fingerprint as before
  if (topology == kTopologyHierarchical) {  // (other topologies: fingerprint as before)
    f.add(local_size);
    f.add(uint8_t(intra_mode));
  }
  if (mode == kModeAuto) {
    f.add(uint8_t(auto_lossy));
    f.add(auto_bandwidth);
    f.add(auto_latency);
  }
  if (p.has("error_bound") || p.has("error_bound_rel")) {  // mode bounded, as in version 1
    f.add(p.num_or("error_bound", 0.0));
    f.add(p.num_or("error_bound_rel", 0.0));
  }
  // parameters declared after version 1, by name (the map's order); window_bytes (rank-local
  // receive buffering) and the parameters declared rank-local do not change the wire.
  if (known)
    for (const ParamDecl& d : mode_params(codec_mode()))
      if (d.fingerprint && !in_v1_layout(d.name) && p.has(d.name)) add_param(f, d, p.get(d.name));
  return f.h;
}

std::string CollectiveConfig::describe() const {
  std::ostringstream s;
  s << "mode=" << (mode == kModeAuto ? "auto" : mode_name(mode)) << " topology=" << topology_name(topology);
  if (mode_is_registered(codec_mode())) {
    for (const ParamDecl& d : mode_params(codec_mode()))
      if (params.has(d.name)) s << " " << d.name << "=" << d.show(params.get(d.name));
  }
  s << " seed=" << seed;
  return s.str();
}

std::unique_ptr<Scheme> make_scheme(const CollectiveConfig& cfg) { return make_scheme(cfg.mode, cfg.params); }

}  // namespace dynamiq
