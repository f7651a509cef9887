// Codec parameter declarations (kernels/params.h): what each type accepts and refuses, the words
// of the error messages, and the registry's use of them (make_scheme resolves a mode's
// parameters: unknown names are refused naming the mode's parameters, defaults are filled in).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernels/params.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

ParamValue num(double x) { return ParamValue{x, {}, {}}; }
ParamValue str(const char* s) { return ParamValue{0.0, s, {}}; }
ParamValue list(std::vector<double> l) { return ParamValue{0.0, {}, std::move(l)}; }

std::string refusal(const ParamDecl& d, const ParamValue& v) {
  try {
    d.check(v, d.show(v));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Params, NumbersHonourOpenAndClosedEnds) {
  const ParamDecl d = number_param("bits", 5, 2, 16, true, "a budget");
  EXPECT_EQ(d.allowed(), "a number in (2, 16]");
  EXPECT_EQ(refusal(d, num(16)), "");
  EXPECT_EQ(refusal(d, num(2.0000001)), "");
  EXPECT_EQ(refusal(d, num(2)), "bits=2 is invalid; allowed: a number in (2, 16]");
  EXPECT_NE(refusal(d, num(16.5)), "");
  EXPECT_NE(refusal(d, num(std::nan(""))), "");
  EXPECT_NE(refusal(d, num(std::numeric_limits<double>::infinity())), "");
  ParamDecl w = d;
  w.integral = true;
  EXPECT_EQ(w.allowed(), "a whole number in (2, 16]");
  EXPECT_NE(refusal(w, num(4.5)), "");
  EXPECT_EQ(refusal(w, num(4)), "");
}

TEST(Params, IntegersBoolsChoicesAndLists) {
  const ParamDecl i = integer_param("supergroup_size", 256, 16, 65536, "S");
  EXPECT_EQ(i.allowed(), "an integer in [16, 65536]");
  EXPECT_NE(refusal(i, num(16.5)), "");
  EXPECT_NE(refusal(i, num(15)), "");
  const ParamDecl b = bool_param("log_scales", false, "log");
  EXPECT_EQ(b.allowed(), "True, False");
  EXPECT_NE(refusal(b, num(2)), "");
  const ParamDecl c = choice_param("rounding", {"correlated", "independent"}, "r");
  EXPECT_EQ(c.def.str, "correlated") << "a choice's default is its first";
  EXPECT_EQ(refusal(c, str("nearest")), "rounding='nearest' is invalid; allowed: 'correlated', 'independent'");
  ParamDecl eps = unset(number_param("eps", 0, 0, 4, false, "eps"));
  eps.type = ParamType::kNumbers;
  eps.size = 4;
  eps.also = {-1};
  EXPECT_EQ(eps.allowed(), "None or 4 numbers, each in [0, 4] or -1");
  EXPECT_EQ(refusal(eps, list({-1, 0, 4, 0.3})), "");
  EXPECT_NE(refusal(eps, list({-1, 0, 4})), "") << "the length is part of the type";
  EXPECT_NE(refusal(eps, list({-0.5, 0, 0, 0})), "");
  ParamDecl widths;
  widths.name = "widths";
  widths.type = ParamType::kIntegers;
  widths.also = {1, 2, 4, 8, 16};
  EXPECT_EQ(refusal(widths, list({2, 4, 8})), "");
  EXPECT_NE(refusal(widths, list({})), "");
  EXPECT_NE(refusal(widths, list({3})), "");
  EXPECT_NE(refusal(widths, list({4, 4})), "") << "a set: no repeats";
}

TEST(Params, ResolveFillsDefaultsAndNamesTheModesParameters) {
  const std::vector<ParamDecl> decls = {number_param("bits", 5, 2, 16, true, "b"),
                                        unset(integer_param("group_size", 0, 1, 4096, "g"))};
  const ParamSet none = resolve_params(decls, ParamSet(), "m");
  EXPECT_EQ(none.num("bits"), 5.0);
  EXPECT_FALSE(none.has("group_size")) << "a parameter without a default stays unset";
  ParamSet given;
  given.set("group_size", 32.0);
  EXPECT_EQ(resolve_params(decls, given, "m").num("group_size"), 32.0);
  given.set("error_bound", 1e-3);
  try {
    resolve_params(decls, given, "m");
    FAIL() << "an undeclared parameter was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "error_bound is not a parameter of mode 'm' (its parameters: bits, group_size)");
  }
  EXPECT_THROW(ParamSet().get("bits"), Error);
}

TEST(Params, TheRegistryRefusesBadDeclarations) {
  const auto factory = [](const ParamSet&) -> std::unique_ptr<Scheme> { return nullptr; };
  EXPECT_THROW(register_codec("twice", Mode(210), factory,
                              {bool_param("x", false, "x"), bool_param("x", true, "x")}),
               Error);
  EXPECT_THROW(register_codec("baddefault", Mode(211), factory, {number_param("x", 20, 0, 16, false, "x")}),
               Error);
  EXPECT_FALSE(mode_is_registered(Mode(210)));
  EXPECT_FALSE(mode_is_registered(Mode(211)));
}

// make_scheme checks the given parameters against the mode's own declarations: every built-in
// mode refuses a parameter it does not declare, naming its parameters, and runs with its
// defaults alone (bounded excepted: it needs one of its two bounds).
TEST(Params, EveryModeRefusesAnotherModesParameter) {
  for (const ModeInfo& m : registered_modes()) {
    ParamSet p;
    p.set("no_such_parameter", 1.0);
    try {
      make_scheme(m.id, p);
      ADD_FAILURE() << m.name << " accepted an undeclared parameter";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no_such_parameter is not a parameter of mode '" + m.name + "'"),
                std::string::npos)
          << e.what();
    }
    if (m.name != "bounded") EXPECT_NO_THROW(make_scheme(m.id, ParamSet())) << m.name;
  }
}

}  // namespace
}  // namespace dynamiq
