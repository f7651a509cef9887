// CollectiveConfig::fingerprint, the value ranks compare in the header exchange, changes with
// every field that changes what goes on the wire (issue 35, item 5: the C++ test varied only
// `seed`, so a fingerprint that ignored `bits` passed it). Each field is changed alone, to a
// value a user could pass, and every fingerprint must differ from the default's and from each
// other's; window_bytes (rank-local receive buffering) must not change it. A field added to
// the struct without a line here fails the size check below, so it is not forgotten.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "hook/collective/collective.h"
#include "hook/collective/config.h"
#include "hook/transport/inproc_transport.h"
#include "params_util.h"

namespace dynamiq {
namespace {

struct Variant {
  std::string field;
  std::function<void(CollectiveConfig&)> change;
};

// A codec parameter set on its own mode (a parameter of another mode is refused by make_scheme).
std::function<void(CollectiveConfig&)> param(const char* mode, const char* name, ParamValue v) {
  return [=](CollectiveConfig& c) {
    c.mode = mode_id(mode);
    c.params.set(name, v);
  };
}
ParamValue num(double x) { return ParamValue{x, {}, {}}; }
ParamValue str(const char* s) { return ParamValue{0.0, s, {}}; }
ParamValue list(std::vector<double> l) { return ParamValue{0.0, {}, std::move(l)}; }

std::vector<Variant> variants() {
  return {
      {"mode", [](CollectiveConfig& c) { c.mode = mode_id("dynamiq"); }},
      {"mode lossless", [](CollectiveConfig& c) { c.mode = mode_id("lossless"); }},
      {"mode bitsplit", [](CollectiveConfig& c) { c.mode = mode_id("bitsplit"); }},
      {"mode bounded", param("bounded", "error_bound", num(1e-2))},
      {"topology", [](CollectiveConfig& c) { c.topology = topology_id("butterfly"); }},
      {"topology twostep", [](CollectiveConfig& c) { c.topology = topology_id("twostep"); }},
      {"seed", [](CollectiveConfig& c) { c.seed = 1; }},
      {"seed high bits", [](CollectiveConfig& c) { c.seed = uint64_t(1) << 63; }},
      {"bits", param("dynamiq", "bits", num(4.0))},
      {"bits by one ulp", param("dynamiq", "bits", num(std::nextafter(5.0, 6.0)))},
      {"widths", param("dynamiq", "widths", list({1, 2, 4, 8}))},
      {"allocator", param("dynamiq", "allocator", str("exact"))},
      {"rounding (dynamiq)", param("dynamiq", "rounding", str("independent"))},
      {"rounding (bitsplit)", param("bitsplit", "rounding", str("nearest"))},
      {"bits (bitsplit)", param("bitsplit", "bits", num(5.0))},
      {"group_size", param("dynamiq", "group_size", num(32))},
      {"group_size (bitsplit)", param("bitsplit", "group_size", num(64))},
      {"supergroup_size", param("dynamiq", "supergroup_size", num(512))},
      {"spike_reserve", param("bitsplit", "spike_reserve", num(1))},
      {"spike_reserve off", param("bitsplit", "spike_reserve", num(0))},
      {"log_scales", param("bitsplit", "log_scales", num(1))},
      {"eps[0]", param("dynamiq", "eps", list({0.1, -1, -1, -1}))},
      {"eps[1]", param("dynamiq", "eps", list({-1, 0.1, -1, -1}))},
      {"eps[2]", param("dynamiq", "eps", list({-1, -1, 0.25, -1}))},
      {"eps[3]", param("dynamiq", "eps", list({-1, -1, -1, 0.05}))},
      {"uniform_levels", param("dynamiq", "uniform_levels", num(1))},
      {"hierarchical_scales", param("dynamiq", "hierarchical_scales", num(0))},
      {"block_bytes", [](CollectiveConfig& c) { c.block_bytes = 65536; }},
      {"min_compress_numel", [](CollectiveConfig& c) { c.min_compress_numel = 1024; }},
      {"max_collective_bytes", [](CollectiveConfig& c) { c.max_collective_bytes = int64_t(64) << 20; }},
      {"max_collective_bytes 0 (never split)", [](CollectiveConfig& c) { c.max_collective_bytes = 0; }},
      // hierarchical's fields count only under that topology, auto's only in mode auto
      {"topology hierarchical", [](CollectiveConfig& c) { c.topology = kTopologyHierarchical; }},
      {"local_size", [](CollectiveConfig& c) { c.topology = kTopologyHierarchical; c.local_size = 2; }},
      {"intra_mode", [](CollectiveConfig& c) { c.topology = kTopologyHierarchical; c.intra_mode = mode_id("lossless"); }},
      {"mode auto", [](CollectiveConfig& c) { c.mode = kModeAuto; }},
      {"auto_lossy", [](CollectiveConfig& c) { c.mode = kModeAuto; c.auto_lossy = mode_id("bitsplit"); }},
      {"auto_bandwidth", [](CollectiveConfig& c) { c.mode = kModeAuto; c.auto_bandwidth = 1e9; }},
      {"auto_latency", [](CollectiveConfig& c) { c.mode = kModeAuto; c.auto_latency = 1e-4; }},
      {"auto's bits", [](CollectiveConfig& c) { c.mode = kModeAuto; c.params.set("bits", 4.0); }},
      {"error_bound", param("bounded", "error_bound", num(1e-3))},
      {"error_bound by one ulp", param("bounded", "error_bound", num(std::nextafter(1e-3, 1.0)))},
      {"error_bound_rel", param("bounded", "error_bound_rel", num(1e-3))},
  };
}

TEST(ConfigFingerprint, EveryWireFieldChangesIt) {
  const CollectiveConfig base;
  std::map<uint64_t, std::string> seen{{base.fingerprint(), "default"}};
  for (const Variant& v : variants()) {
    CollectiveConfig c;
    v.change(c);
    const uint64_t f = c.fingerprint();
    const auto [it, fresh] = seen.emplace(f, v.field);
    EXPECT_TRUE(fresh) << v.field << " gives the fingerprint of " << it->second;
    EXPECT_EQ(c.fingerprint(), f) << v.field << ": not deterministic";
  }
}

// The fields of topology hierarchical and mode auto leave the other topologies' and modes'
// fingerprints as they were (tests/golden/wire.txt holds them).
TEST(ConfigFingerprint, NewFieldsOnlyWhereUsed) {
  CollectiveConfig c;
  const uint64_t f = c.fingerprint();
  c.local_size = 4;
  c.intra_mode = mode_id("lossless");
  c.auto_lossy = mode_id("bitsplit");
  c.auto_bandwidth = 1e9;
  c.auto_latency = 1e-3;
  EXPECT_EQ(c.fingerprint(), f);
}

TEST(ConfigFingerprint, RankLocalWindowDoesNotChangeIt) {
  CollectiveConfig c;
  const uint64_t f = c.fingerprint();
  c.window_bytes = 1 << 10;
  EXPECT_EQ(c.fingerprint(), f);
}

// Every field of the struct is one of the variants above or window_bytes (the codec parameters
// are one field, `params`, and each codec's declarations say which enter the fingerprint). On
// LP64 (x86-64, aarch64) with libstdc++ the struct is 120 bytes; a new field changes that: add it
// to the fingerprint (or say why not, as for window_bytes) and to variants(), then update the
// size here.
TEST(ConfigFingerprint, NoFieldIsForgotten) {
  EXPECT_EQ(sizeof(CollectiveConfig), 120u)
      << "CollectiveConfig changed: fingerprint the new field and add it to this test's variants";
}

// A parameter given with its default value fingerprints as the default left out (the fingerprint
// resolves the parameters as the codec will run them), and the default of a parameter is part of it.
TEST(ConfigFingerprint, DefaultsGivenOrNotAreTheSame) {
  for (const ModeInfo& m : registered_modes()) {
    CollectiveConfig a, b;
    a.mode = b.mode = m.id;
    for (const ParamDecl& d : mode_params(m.id))
      if (d.has_default) b.params.set(d.name, d.def);
    EXPECT_EQ(a.fingerprint(), b.fingerprint()) << m.name;
  }
}

// End to end: ranks whose configs differ only in `bits` refuse to run together (same
// error on every rank), which a fingerprint ignoring `bits` would let through to decode
// each other's messages with different plans.
TEST(ConfigFingerprint, RanksDisagreeingOnBitsRaiseOnEveryRank) {
  InprocWorld world(3, std::chrono::seconds(10));
  std::vector<std::string> errors(3);
  world.run([&](int r, Transport& t) {
    CollectiveConfig c;
    c.mode = mode_id("dynamiq");
    c.params.set("bits", r == 2 ? 4.0 : 5.0);
    std::vector<float> x(8192, 1.0f);
    CallArgs a;
    a.data = x.data();
    a.numel = int64_t(x.size());
    try {
      all_reduce(t, c, a);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[size_t(r)].find("ranks disagree on config fingerprint"), std::string::npos) << errors[size_t(r)];
    EXPECT_EQ(errors[size_t(r)], errors[0]);
  }
}

}  // namespace
}  // namespace dynamiq
