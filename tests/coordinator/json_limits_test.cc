// ParseJsonWithLimits (coordinator/json_limits.h): the depth and value-count bounds, exactly at
// and one past each limit, and deep inputs refused without recursion.
#include "coordinator/json_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace ss {
namespace {

std::string Nested(int depth, const char* open = "[", const char* close = "]") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  s += "1";
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(JsonLimits, DepthLimitIsExact) {
  auto ok = ParseJsonWithLimits(Nested(kMaxJsonDepth));
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto deep = ParseJsonWithLimits(Nested(kMaxJsonDepth + 1));
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(deep.status().message(), "JSON nested deeper than 64 levels");
  // Objects count as levels too, mixed with arrays.
  std::string mixed;
  for (int i = 0; i < 40; ++i) mixed += R"({"a":[)";
  mixed += "1";
  for (int i = 0; i < 40; ++i) mixed += "]}";
  EXPECT_EQ(ParseJsonWithLimits(mixed).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ParseJsonWithLimits(mixed, {.max_depth = 80}).ok());
}

TEST(JsonLimits, HugeDepthIsRefusedNotRecursed) {
  // Far past any thread's stack if anything recursed per level; also unbalanced.
  const std::string deep(4'000'000, '[');
  EXPECT_EQ(ParseJsonWithLimits(deep).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ParseJsonWithLimits(Nested(1'000'000, "{\"k\":", "}")).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(JsonLimits, ValueCountLimitIsExact) {
  // [1,1,1] is 4 values: the array and three scalars; {"a":1} is 3 (object, key, value).
  EXPECT_TRUE(ParseJsonWithLimits("[1,1,1]", {.max_values = 4}).ok());
  auto over = ParseJsonWithLimits("[1,1,1,1]", {.max_values = 4});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(), "JSON with more than 4 values");
  EXPECT_TRUE(ParseJsonWithLimits(R"({"a":1})", {.max_values = 3}).ok());
  EXPECT_FALSE(ParseJsonWithLimits(R"({"a":1,"b":2})", {.max_values = 3}).ok());
  // The default admits a 1M-token id prompt.
  std::string ids = "[";
  for (int i = 0; i < 1'000'000; ++i) ids += i ? ",7" : "7";
  ids += "]";
  EXPECT_TRUE(ParseJsonWithLimits(ids).ok());
}

TEST(JsonLimits, SyntaxErrorsAreInvalidArgument) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "nul", "[1] x"}) {
    auto r = ParseJsonWithLimits(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto r = ParseJsonWithLimits(R"({"b":[1,{"c":null}],"a":"x"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dump(), R"({"b":[1,{"c":null}],"a":"x"})");  // key order kept
}

}  // namespace
}  // namespace ss
