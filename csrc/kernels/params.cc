// Codec parameter declarations: see params.h.
#include "kernels/params.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "kernels/base/common.h"

namespace dynamiq {
namespace {

std::string fmt(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  // shortest of %g forms that reads back exactly
  for (int prec = 1; prec <= 17; ++prec) {
    char c[40];
    std::snprintf(c, sizeof c, "%.*g", prec, x);
    if (std::strtod(c, nullptr) == x) return c;
  }
  return b;
}

bool whole(double x) { return std::isfinite(x) && std::floor(x) == x; }

std::string join(const std::vector<double>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt(v[i]);
  return s;
}

}  // namespace

std::string ParamDecl::allowed() const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  auto range = [&](const char* what) {
    std::string s = what;
    if (has_lo && has_hi)
      s += std::string(" in ") + (lo_open ? "(" : "[") + fmt(lo) + ", " + fmt(hi) + "]";
    else if (has_lo)
      s += std::string(lo_open ? " > " : " >= ") + fmt(lo);
    else if (has_hi)
      s += " <= " + fmt(hi);
    return s;
  };
  std::string s;
  switch (type) {
    case ParamType::kNumber: s = range(integral ? "a whole number" : "a number"); break;
    case ParamType::kInteger: s = range("an integer"); break;
    case ParamType::kBool: s = "True, False"; break;
    case ParamType::kChoice:
      for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + ("'" + choices[i] + "'");
      break;
    case ParamType::kNumbers:
      s = std::to_string(size) + " numbers, each" + range("") + (also.empty() ? "" : " or " + join(also));
      break;
    case ParamType::kIntegers: s = "a non-empty subset of {" + join(also) + "} without repeats"; break;
  }
  if (!has_default) s = "None or " + s;
  return s;
}

std::string ParamDecl::show(const ParamValue& v) const {
  switch (type) {
    case ParamType::kBool: return v.num != 0.0 ? "True" : "False";
    case ParamType::kChoice: return "'" + v.str + "'";
    case ParamType::kNumbers:
    case ParamType::kIntegers: return "(" + join(v.list) + ")";
    default: return fmt(v.num);
  }
}

void ParamDecl::check(const ParamValue& v, const std::string& shown) const {
  auto in_range = [&](double x) {
    if (std::isnan(x)) return false;
    if (lo_open ? !(x > lo) : !(x >= lo)) return false;
    return x <= hi;
  };
  auto is_also = [&](double x) {
    for (double a : also)
      if (a == x) return true;
    return false;
  };
  bool ok = true;
  switch (type) {
    case ParamType::kNumber: ok = std::isfinite(v.num) && in_range(v.num) && (!integral || whole(v.num)); break;
    case ParamType::kInteger: ok = whole(v.num) && in_range(v.num); break;
    case ParamType::kBool: ok = v.num == 0.0 || v.num == 1.0; break;
    case ParamType::kChoice: {
      ok = false;
      for (const auto& c : choices) ok = ok || c == v.str;
      break;
    }
    case ParamType::kNumbers:
      ok = int(v.list.size()) == size;
      for (double x : v.list) ok = ok && std::isfinite(x) && (in_range(x) || is_also(x));
      break;
    case ParamType::kIntegers: {
      ok = !v.list.empty() && std::set<double>(v.list.begin(), v.list.end()).size() == v.list.size();
      for (double x : v.list) ok = ok && is_also(x);
      break;
    }
  }
  if (!ok) throw Error(name + "=" + shown + " is invalid; allowed: " + allowed());
}

ParamDecl number_param(std::string name, double def, double lo, double hi, bool lo_open, std::string doc) {
  ParamDecl d;
  d.name = std::move(name);
  d.type = ParamType::kNumber;
  d.def.num = def;
  d.lo = lo, d.hi = hi, d.lo_open = lo_open;
  d.doc = std::move(doc);
  return d;
}

ParamDecl integer_param(std::string name, double def, double lo, double hi, std::string doc) {
  ParamDecl d = number_param(std::move(name), def, lo, hi, false, std::move(doc));
  d.type = ParamType::kInteger;
  return d;
}

ParamDecl bool_param(std::string name, bool def, std::string doc) {
  ParamDecl d;
  d.name = std::move(name);
  d.type = ParamType::kBool;
  d.def.num = def ? 1.0 : 0.0;
  d.doc = std::move(doc);
  return d;
}

ParamDecl choice_param(std::string name, std::vector<std::string> choices, std::string doc) {
  ParamDecl d;
  d.name = std::move(name);
  d.type = ParamType::kChoice;
  d.def.str = choices.empty() ? std::string() : choices.front();
  d.choices = std::move(choices);
  d.doc = std::move(doc);
  return d;
}

ParamDecl unset(ParamDecl d) {
  d.has_default = false;
  d.def = ParamValue{};
  return d;
}

const ParamValue& ParamSet::get(std::string_view name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) throw Error("parameter '" + std::string(name) + "' is not set (not a parameter of this mode?)");
  return it->second;
}

ParamSet resolve_params(const std::vector<ParamDecl>& decls, const ParamSet& given, std::string_view mode) {
  ParamSet out;
  for (const auto& [name, v] : given.values()) {
    const ParamDecl* d = nullptr;
    for (const auto& x : decls)
      if (x.name == name) d = &x;
    if (d == nullptr) {
      std::string names;
      for (const auto& x : decls) names += (names.empty() ? "" : ", ") + x.name;
      throw Error(name + " is not a parameter of mode '" + std::string(mode) + "' (its parameters: " +
                  (names.empty() ? "none" : names) + ")");
    }
    d->check(v, d->show(v));
    out.set(name, v);
  }
  for (const auto& d : decls)
    if (d.has_default && !out.has(d.name)) out.set(d.name, d.def);
  return out;
}

}  // namespace dynamiq
