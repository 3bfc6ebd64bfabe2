// Integer and decimal ranges as GBNF expressions, for JSON Schema's minimum / maximum /
// exclusiveMinimum / exclusiveMaximum (json_schema_gbnf.h).
//
// Numbers are written as JSON writes them: decimal, no leading zeros, "-" before negative ones,
// never "-0", at most 16 integer digits (kMaxRangeMagnitude), no exponent. The expressions are
// digit-by-digit alternatives (the classic regex range construction, as llama.cpp's
// json-schema-to-grammar builds them): their size grows with the number of digits of the bounds,
// not with the width of the range. Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ss::grammar {

inline constexpr int64_t kMaxRangeMagnitude = 9999999999999999;  // 16 digits

// Every integer in [lo, hi]. Requires -kMaxRangeMagnitude <= lo <= hi <= kMaxRangeMagnitude.
std::string IntegerRangeGbnf(int64_t lo, int64_t hi);

// Every decimal x (integer part, optionally "." and 1–16 fraction digits) with lo < x or lo <= x
// (`lo_exclusive`) and x < hi or x <= hi, the bounds integers of magnitude at most
// kMaxRangeMagnitude or absent (then up to 16 integer digits). "" when no such x exists.
std::string DecimalRangeGbnf(std::optional<int64_t> lo, bool lo_exclusive,
                             std::optional<int64_t> hi, bool hi_exclusive);

}  // namespace ss::grammar
