// A mode's parameters, declared by the codec in its own folder (<codec>_scheme.cc) and listed
// with the mode in the registry (registry.h). Everything that knows a codec's parameters is
// made from these declarations: the Python `dynamiq.Config` fields, their validation and error
// messages and docstring lines (python/dynamiq/config.py asks `_C.mode_info()`), the C++
// `CollectiveConfig::params` checks, the config fingerprint (hook/collective/config.cc), and
// docs/api.md's parameter table (tests/python/test_params.py checks it against them).
//
// A value is a number (integers and booleans too), a string (one of `choices`) or a list of
// numbers. A parameter without a default is "unset" unless given (Python None): the codec then
// picks (group_size: the mode's own; error_bound: one of two must be given).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dynamiq {

// A mode's id. The modes and their ids are listed in the codec registry
// (kernels/registry.h: mode_id("dynamiq"), mode_name(id)); the id is part of
// the wire fingerprint: never renumber.
enum class Mode : uint8_t {};
// Mode "none" (the identity codec, which is also the exact path of every
// other mode): the default.
inline constexpr Mode kModeNone = Mode(0);
// Mode "auto" (hook/collective/auto_mode.h): per bucket one of auto_lossy,
// lossless and none, from a cost model. Not a codec: never in the registry.
inline constexpr Mode kModeAuto = Mode(255);

enum class ParamType : uint8_t {
  kNumber,    // a finite real
  kInteger,   // a whole number (a Python int, not a bool)
  kBool,      // True / False
  kChoice,    // one of `choices`
  kNumbers,   // a list of `size` finite reals (each: the range, or one of `also`)
  kIntegers,  // a non-empty set of whole numbers (each: one of `also`), no repeats
};

struct ParamValue {
  double num = 0.0;           // kNumber, kInteger, kBool (0 / 1)
  std::string str;            // kChoice
  std::vector<double> list;   // kNumbers, kIntegers
  bool operator==(const ParamValue&) const = default;
};

struct ParamDecl {
  std::string name;
  ParamType type = ParamType::kNumber;
  std::string doc;  // one line, for the Config docstring and docs/api.md
  bool has_default = true;
  ParamValue def;
  // kNumber / kInteger / kNumbers' elements: lo <= v <= hi (lo < v when lo_open), or one of `also`.
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool integral = false;          // kNumber that must be a whole number (bitsplit's bits)
  std::vector<double> also;       // kNumbers: values allowed outside [lo, hi]; kIntegers: the allowed set
  std::vector<std::string> choices;  // kChoice
  int size = 0;                   // kNumbers: the length
  // Enters the config fingerprint (every rank must agree on it). A rank-local parameter, one that
  // changes nothing on the wire, says false.
  bool fingerprint = true;

  // What a valid value is, in words, for error messages: "a number in (2, 16]".
  std::string allowed() const;
  // Throws Error "<name>=<shown> is invalid; allowed: <allowed()>" unless v is valid. `shown` is
  // the value as the caller's language writes it (Python passes repr()).
  void check(const ParamValue& v, const std::string& shown) const;
  // The value as text (for messages and describe()).
  std::string show(const ParamValue& v) const;
};

// Builders for declarations (keep the codecs' lists one line a parameter).
ParamDecl number_param(std::string name, double def, double lo, double hi, bool lo_open, std::string doc);
ParamDecl integer_param(std::string name, double def, double lo, double hi, std::string doc);
ParamDecl bool_param(std::string name, bool def, std::string doc);
ParamDecl choice_param(std::string name, std::vector<std::string> choices, std::string doc);  // default: the first
// A parameter with no default (unset unless given).
ParamDecl unset(ParamDecl d);

// The parameters given for a collective, by name. After resolve_params() it holds every
// declared parameter with a default, plus the unset ones that were given.
class ParamSet {
 public:
  void set(const std::string& name, ParamValue v) { values_[name] = std::move(v); }
  void set(const std::string& name, double num) { values_[name] = ParamValue{num, {}, {}}; }
  void set(const std::string& name, const char* s) { values_[name] = ParamValue{0.0, s, {}}; }
  void set(const std::string& name, std::vector<double> list) { values_[name] = ParamValue{0.0, {}, std::move(list)}; }
  void erase(const std::string& name) { values_.erase(name); }
  void clear() { values_.clear(); }
  bool has(std::string_view name) const { return values_.find(name) != values_.end(); }
  // Throw Error naming the parameter when it is not there (a codec reading an undeclared name).
  const ParamValue& get(std::string_view name) const;
  double num(std::string_view name) const { return get(name).num; }
  bool flag(std::string_view name) const { return get(name).num != 0.0; }
  const std::string& str(std::string_view name) const { return get(name).str; }
  const std::vector<double>& list(std::string_view name) const { return get(name).list; }
  // A number, or `otherwise` when unset.
  double num_or(std::string_view name, double otherwise) const { return has(name) ? num(name) : otherwise; }
  const std::map<std::string, ParamValue, std::less<>>& values() const { return values_; }
  bool empty() const { return values_.empty(); }
  bool operator==(const ParamSet&) const = default;

 private:
  std::map<std::string, ParamValue, std::less<>> values_;
};

// `given` checked against `decls` (Error "mode '<mode>' has no parameter 'x' (its parameters:
// a, b, c)" for an unknown name, ParamDecl::check's message for a bad value), with every
// declared default filled in.
ParamSet resolve_params(const std::vector<ParamDecl>& decls, const ParamSet& given, std::string_view mode);

}  // namespace dynamiq
