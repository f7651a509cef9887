// The modes a cross-mode test iterates over, from the codec registry (kernels/registry.h): every
// registered mode, the test-only ones (tests/cpp/*_codec, registered when built in) included, each
// with parameters it runs with taken from its declarations (example_params), so that a codec is
// tested by these loops by registering it. The topologies come from the topology registry
// likewise (schedule_topologies, hook/collective/topology.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hook/collective/config.h"
#include "hook/collective/schedule.h"
#include "kernels/registry.h"
#include "kernels/scheme.h"

namespace dynamiq {

struct ModeCase {
  Mode id{};
  std::string name;
  bool exact = false;    // Scheme::exact of its scheme with `params`
  bool builtin = false;  // registry.cc's list, not a test-only codec
  ParamSet params;       // example_params(id)
};

enum class Modes { kAll, kExact, kLossy };

// Parameters `mode` runs with, from its declarations alone: none given (every default); where its
// scheme refuses that (bounded needs one of its two bounds), the first parameter without a
// default, of type number, set just inside its declared range (lo + min(1e-3, (hi - lo) / 2):
// bounded's error_bound 1e-3). Fails the test for a mode that runs with neither.
inline ParamSet example_params(Mode mode) {
  ParamSet p;
  try {
    make_scheme(mode, p);
    return p;
  } catch (const Error&) {
  }
  for (const ParamDecl& d : mode_params(mode)) {
    if (d.has_default || d.type != ParamType::kNumber) continue;
    const double lo = std::isfinite(d.lo) ? d.lo : -1.0;
    p.clear();
    p.set(d.name, lo + std::min(1e-3, (d.hi - lo) / 2));
    try {
      make_scheme(mode, p);
      return p;
    } catch (const Error&) {
    }
  }
  throw Error(std::string("mode_cases.h: mode '") + mode_name(mode) +
              "' runs neither with its defaults nor with one of its parameters set inside its range");
}

// The registered modes of that kind, by id.
inline std::vector<ModeCase> mode_cases(Modes which = Modes::kAll) {
  std::vector<ModeCase> out;
  for (const ModeInfo& m : registered_modes()) {
    ParamSet p = example_params(m.id);
    const bool exact = make_scheme(m.id, p)->exact();
    if ((which == Modes::kExact && !exact) || (which == Modes::kLossy && exact)) continue;
    out.push_back({m.id, m.name, exact, m.builtin, std::move(p)});
  }
  return out;
}

// `c` set to run mode `m` with its parameters.
inline CollectiveConfig with_mode(CollectiveConfig c, const ModeCase& m) {
  c.mode = m.id;
  c.params = m.params;
  return c;
}

// Whether the mode's messages have a variable part (Codec::max_dynamic_bytes > 0: lossless,
// bounded), so that their sizes depend on the data, rather than following from the plan alone.
// Asked of the plan of a small Gaussian-like bucket on one rank, made as a collective makes it.
inline bool two_part_messages(const ModeCase& m) {
  const auto s = make_scheme(m.id, m.params);
  const int64_t numel = 4096;
  std::vector<float> x(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) x[size_t(i)] = float((i * 7919) % 2001 - 1000) / 997.0f;
  std::vector<float> stats(static_cast<size_t>(s->stats_count(DType::kF32, numel)));
  s->local_pass(x.data(), DType::kF32, numel, stats.data());
  PlanState ps;
  PlanInfo info;
  const Plan plan = s->make_plan(DType::kF32, numel, 1, 1, stats.data(), ps, info);
  for (const Block& b : make_blocks(plan, 1 << 20).blocks)
    if (s->codec().max_dynamic_bytes(plan, b) > 0) return true;
  return false;
}

// The case of one mode, by name (for a test that also picks one mode).
inline ModeCase mode_case(const std::string& name) {
  for (ModeCase& m : mode_cases())
    if (m.name == name) return m;
  throw Error("mode_case: no registered mode '" + name + "'");
}

}  // namespace dynamiq
