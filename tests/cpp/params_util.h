// Shorthands for tests and benchmarks that set codec parameters from C++ (kernels/params.h):
// the dynamiq widths as a bit mask, bitsplit's spike_reserve as the -1/0/1 it was before modes
// declared their parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/params.h"
#include "kernels/registry.h"

namespace dynamiq {

// Widths {w : bit w of mask set}, for the "widths" parameter.
inline std::vector<double> widths_of(uint32_t mask) {
  std::vector<double> w;
  for (int b = 0; b < 32; ++b)
    if ((mask >> b) & 1u) w.push_back(double(b));
  return w;
}

// -1: unset (the mode's choice); 0 / 1: off / on.
inline void set_spike_reserve(ParamSet& p, int v) {
  if (v < 0)
    p.erase("spike_reserve");
  else
    p.set("spike_reserve", double(v != 0));
}

// Sets a parameter only where `mode` declares it: for loops over modes that give each one its
// setting (bits for dynamiq and bitsplit, nothing for none and lossless).
inline void set_if_declared(Mode mode, ParamSet& p, const std::string& name, ParamValue v) {
  for (const ParamDecl& d : mode_params(mode))
    if (d.name == name) p.set(name, std::move(v));
}
inline ParamValue num_value(double x) { return ParamValue{x, {}, {}}; }
inline ParamValue str_value(const char* s) { return ParamValue{0.0, s, {}}; }

}  // namespace dynamiq
