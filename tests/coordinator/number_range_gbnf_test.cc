// IntegerRangeGbnf / DecimalRangeGbnf against arithmetic: for random bounds, every number text in
// a window around them is accepted exactly when its value is in the range.
#include "coordinator/grammar/number_range_gbnf.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/coordinator/grammar_test_util.h"

namespace ss::grammar {
namespace {

using testing::Accepts;
using testing::Compile;

TEST(NumberRangeGbnf, IntegersMatchArithmetic) {
  std::mt19937 rng(5);
  for (int i = 0; i < 120; ++i) {
    const int64_t scale = std::vector<int64_t>{10, 300, 20000}[i % 3];
    int64_t lo = std::uniform_int_distribution<int64_t>(-scale, scale)(rng);
    int64_t hi = std::uniform_int_distribution<int64_t>(-scale, scale)(rng);
    if (lo > hi) std::swap(lo, hi);
    SCOPED_TRACE(absl::StrCat("[", lo, ", ", hi, "]"));
    auto g = Compile(absl::StrCat("root ::= ", IntegerRangeGbnf(lo, hi), "\n"));
    ASSERT_NE(g, nullptr);
    for (int k = 0; k < 400; ++k) {
      const int64_t v = std::uniform_int_distribution<int64_t>(lo - 50, hi + 50)(rng);
      EXPECT_EQ(Accepts(g, std::to_string(v)), lo <= v && v <= hi) << v;
    }
    EXPECT_FALSE(Accepts(g, "-0"));
    EXPECT_FALSE(Accepts(g, absl::StrCat("0", std::max<int64_t>(lo, 1))));  // no leading zero
  }
  auto wide = Compile(
      absl::StrCat("root ::= ", IntegerRangeGbnf(-kMaxRangeMagnitude, kMaxRangeMagnitude), "\n"));
  ASSERT_NE(wide, nullptr);
  EXPECT_TRUE(Accepts(wide, "9999999999999999"));
  EXPECT_TRUE(Accepts(wide, "-9999999999999999"));
  EXPECT_FALSE(Accepts(wide, "10000000000000000"));
}

TEST(NumberRangeGbnf, DecimalsMatchArithmetic) {
  std::mt19937 rng(9);
  for (int i = 0; i < 150; ++i) {
    std::optional<int64_t> lo, hi;
    if (i % 4 != 0) lo = std::uniform_int_distribution<int64_t>(-20, 20)(rng);
    if (i % 4 != 1) hi = std::uniform_int_distribution<int64_t>(-20, 20)(rng);
    if (lo && hi && *lo > *hi) std::swap(lo, hi);
    const bool lo_ex = rng() % 2, hi_ex = rng() % 2;
    SCOPED_TRACE(absl::StrCat(lo ? std::to_string(*lo) : "-inf", lo_ex ? " < " : " <= ", "x",
                              hi_ex ? " < " : " <= ", hi ? std::to_string(*hi) : "inf"));
    const std::string range = DecimalRangeGbnf(lo, lo_ex, hi, hi_ex);
    const bool empty = lo && hi && (*lo > *hi || (*lo == *hi && (lo_ex || hi_ex)));
    ASSERT_EQ(range.empty(), empty);
    if (empty) continue;
    auto g = Compile(absl::StrCat("root ::= ", range, "\n"));
    ASSERT_NE(g, nullptr) << range;
    for (int k = 0; k < 300; ++k) {
      // Tenths in [-25, 25], written as JSON writes them (and sometimes with a ".0" or "00").
      const int tenths = std::uniform_int_distribution<int>(-250, 250)(rng);
      const double v = tenths / 10.0;
      std::string text = absl::StrCat(tenths < 0 ? "-" : "", std::abs(tenths) / 10);
      if (tenths % 10 != 0) {
        absl::StrAppend(&text, ".", std::abs(tenths) % 10);
      } else if (rng() % 2) {
        absl::StrAppend(&text, rng() % 2 ? ".0" : ".00");
      }
      if (text == "-0" || text.starts_with("-0.0")) continue;  // -0 is never written
      const bool in =
          (!lo || (lo_ex ? v > *lo : v >= *lo)) && (!hi || (hi_ex ? v < *hi : v <= *hi));
      EXPECT_EQ(Accepts(g, text), in) << text;
    }
    EXPECT_FALSE(Accepts(g, "1e1"));
  }
}

}  // namespace
}  // namespace ss::grammar
