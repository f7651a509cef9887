// make_scheme validates the whole config at construction: every config that
// would otherwise fail later, inside planning or a codec, in the middle of a
// collective, throws here instead (the Python Config calls it through the
// validate_config binding), and each mode's default config is accepted.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "mode_cases.h"
#include "hook/collective/config.h"
#include "kernels/registry.h"
#include "params_util.h"

namespace dynamiq {
namespace {

CollectiveConfig mode_cfg(Mode m) {
  CollectiveConfig c;
  c.mode = m;
  return c;
}

void expect_rejected(const CollectiveConfig& c, const std::string& what, const std::string& needle) {
  try {
    make_scheme(c);
    ADD_FAILURE() << what << ": make_scheme accepted it";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
  }
}

TEST(MakeScheme, AcceptsTheDefaultConfigOfEveryMode) {
  // every registered mode: its defaults, or (a mode with a parameter it needs and no default for
  // it: bounded) its declared example; a mode whose every parameter has a default runs on those
  for (const ModeCase& m : mode_cases()) {
    bool all_defaults = true;
    for (const ParamDecl& d : mode_params(m.id)) all_defaults = all_defaults && d.has_default;
    if (all_defaults) EXPECT_TRUE(m.params.empty()) << m.name;
    CollectiveConfig c = mode_cfg(m.id);
    c.params = m.params;
    EXPECT_NO_THROW(make_scheme(c)) << m.name;
  }
  // and settings at the edges of what the codecs support
  CollectiveConfig c = mode_cfg(mode_id("dynamiq"));
  c.params.set("widths", widths_of((1u << 1) | (1u << 2) | (1u << 4) | (1u << 8) | (1u << 16)));
  c.params.set("bits", double(1.5625));  // width 1 with its scales: 32 + 18 bytes per 256 elements, exactly
  EXPECT_NO_THROW(make_scheme(c));
  c = mode_cfg(mode_id("dynamiq"));
  c.params.set("bits", double(82.0 * 8 / 256));  // the narrowest default width (2) with its scales, exactly
  EXPECT_NO_THROW(make_scheme(c));
  c.params.set("bits", double(16.0));
  c.params.set("supergroup_size", double(64));
  c.params.set("group_size", double(8));
  EXPECT_NO_THROW(make_scheme(c));
  c = mode_cfg(mode_id("bitsplit"));
  for (int b = 2; b <= 8; ++b) {
    c.params.set("bits", double(b));
    EXPECT_NO_THROW(make_scheme(c)) << "bitsplit bits=" << b;
  }
}

// Widths whose super-groups are not strictly larger on the wire: with one
// element per group, a width-8 SG carries 256 group scales + a bf16 SG scale
// + 256 code bytes = 514 bytes, more than a width-16 one (512 raw bf16 bytes).
// The allocator rejects that set on every bucket; the scheme must reject it
// when it is built.
TEST(MakeScheme, DynamiqRejectsWidthsThatDoNotGrowOnTheWire) {
  CollectiveConfig c = mode_cfg(mode_id("dynamiq"));
  c.params.set("group_size", double(1));
  c.params.set("widths", widths_of((1u << 8) | (1u << 16)));
  expect_rejected(c, "widths {8, 16}, group_size 1", "not larger on the wire");
  // the declaration's set (kernels/params.h) refuses the rest, naming what is allowed
  const std::string allowed = "allowed: a non-empty subset of {1, 2, 4, 8, 16} without repeats";
  c.params.set("widths", widths_of(0));
  expect_rejected(c, "no widths", allowed);
  c = mode_cfg(mode_id("dynamiq"));
  c.params.set("widths", widths_of((1u << 3) | (1u << 4)));
  expect_rejected(c, "width 3", allowed);
}

TEST(MakeScheme, DynamiqRejectsFormatsAndEpsTheCodecRejects) {
  CollectiveConfig c = mode_cfg(mode_id("dynamiq"));
  c.params.set("supergroup_size", double(25));
  c.params.set("group_size", double(5));
  expect_rejected(c, "supergroup 25, group 5", "multiple of 8");
  c = mode_cfg(mode_id("dynamiq"));
  c.params.set("group_size", double(24));
  expect_rejected(c, "group 24", "multiple of group_size");
  // eps per width 1, 2, 4, 8 (-1: the default; NaN is not the default): the declaration refuses
  // what is out of its range, the codec what collapses in float32
  const std::string out_of_range = "allowed: None or 4 numbers, each in [0, 4] or -1";
  const struct {
    std::array<float, 4> eps;
    const char* what;
    std::string needle;
  } cases[] = {
      {{-1.f, -1.f, -1.f, 5.0f}, "eps 5 at width 8", out_of_range},
      {{-1.f, std::nanf(""), -1.f, -1.f}, "eps NaN at width 2", out_of_range},
      {{-1.f, -1.f, -1.f, std::numeric_limits<float>::infinity()}, "eps inf at width 8", out_of_range},
      {{-1.f, -1.f, -1.f, 3.0f}, "eps 3 at width 8", "collapse"},
  };
  for (const auto& k : cases) {
    c = mode_cfg(mode_id("dynamiq"));
    c.params.set("eps", std::vector<double>(k.eps.begin(), k.eps.end()));
    expect_rejected(c, k.what, k.needle);
  }
}

// A budget no bucket can meet (a whole super-group at the narrowest width is
// already over it) or no number at all: the allocator would throw on every
// bucket; the scheme throws when it is built.
TEST(MakeScheme, DynamiqRejectsBudgetsNoBucketCanMeet) {
  CollectiveConfig c = mode_cfg(mode_id("dynamiq"));
  for (double bits : {0.0, -1.0, double(NAN), double(INFINITY)}) {
    c.params.set("bits", double(bits));
    expect_rejected(c, "bits " + std::to_string(bits), "is invalid; allowed: a number in (0, 16]");
  }
  c.params.set("bits", double(2.5));  // below 2.5625, width 2 with its scales
  expect_rejected(c, "bits 2.5", "2.5625");
  c.params.set("bits", double(std::nextafter(82.0 * 8 / 256, 0.0)));
  expect_rejected(c, "one ulp below the floor", "below the");
  c.params.set("widths", widths_of((1u << 4) | (1u << 8)));
  c.params.set("bits", double(4.5));  // width 4: 128 + 18 bytes per 256 = 4.5625 bits
  expect_rejected(c, "bits 4.5, widths {4, 8}", "4.5625");
  c.params.set("widths", widths_of((1u << 1) | (1u << 4) | (1u << 8)));  // width 1 fits: 32 + 18 bytes per 256 = 1.5625 bits
  EXPECT_NO_THROW(make_scheme(c));
}

TEST(MakeScheme, BitsplitAndUnknownModesAreRejected) {
  CollectiveConfig c = mode_cfg(mode_id("bitsplit"));
  c.params.set("group_size", double(16));
  expect_rejected(c, "bitsplit group_size 16", "group_size=16");
  c = mode_cfg(mode_id("bitsplit"));
  c.params.set("bits", double(3.5));
  expect_rejected(c, "bitsplit bits 3.5", "bits=3.5 is invalid; allowed: a whole number in [2, 8]");
  c = mode_cfg(mode_id("bitsplit"));
  c.params.set("spike_reserve", 2.0);  // a bool parameter
  expect_rejected(c, "bitsplit spike_reserve 2", "allowed: None or True, False");
  expect_rejected(mode_cfg(Mode(7)), "mode 7", "not available");
}

// The exact-budget decision the driver takes before planning: true for every
// size except those whose padded partial last super-group is over the budget.
TEST(MakeScheme, FitsBudgetOnlyFailsForOverBudgetPartialSuperGroups) {
  CollectiveConfig c = mode_cfg(mode_id("dynamiq"));
  const auto s = make_scheme(c);
  EXPECT_TRUE(s->fits_budget(0));
  EXPECT_TRUE(s->fits_budget(256));
  EXPECT_FALSE(s->fits_budget(257));  // 2 SGs of 82 bytes = 1312 bits > 5 * 257
  EXPECT_TRUE(s->fits_budget(4097));
  c.params.set("bits", double(2.6));
  const auto s26 = make_scheme(c);
  EXPECT_FALSE(s26->fits_budget(4097));
  EXPECT_TRUE(s26->fits_budget(4096));
  for (Mode m : {mode_id("none"), mode_id("lossless"), mode_id("bitsplit")})
    for (int64_t numel : {int64_t(1), int64_t(257), int64_t(4097)})
      EXPECT_TRUE(make_scheme(mode_cfg(m))->fits_budget(numel)) << mode_name(m) << " numel=" << numel;
}

}  // namespace
}  // namespace dynamiq
