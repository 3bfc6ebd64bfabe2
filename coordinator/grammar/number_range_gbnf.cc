#include "coordinator/grammar/number_range_gbnf.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace ss::grammar {
namespace {

std::string Alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  return absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
}

// Decimal strings of equal length, lo <= hi: every number between them, as GBNF.
std::string DigitRange(const std::string& lo, const std::string& hi) {
  size_t d = 0;
  while (d < lo.size() && lo[d] == hi[d]) ++d;
  std::string prefix = d > 0 ? absl::StrCat("\"", lo.substr(0, d), "\"") : "";
  if (d == lo.size()) return prefix;
  const size_t rest = lo.size() - d - 1;
  const std::string lo_rest = lo.substr(d + 1), hi_rest = hi.substr(d + 1);
  const bool lo_zeros = lo_rest.find_first_not_of('0') == std::string::npos;
  const bool hi_nines = hi_rest.find_first_not_of('9') == std::string::npos;
  const std::string any_rest =
      rest == 0 ? "" : absl::StrCat(" [0-9]", rest > 1 ? absl::StrCat("{", rest, "}") : "");
  std::vector<std::string> alts;
  if (!lo_zeros) {
    alts.push_back(absl::StrCat("\"", std::string(1, lo[d]), "\" ",
                                DigitRange(lo_rest, std::string(rest, '9'))));
  }
  const char mid_lo = lo_zeros ? lo[d] : static_cast<char>(lo[d] + 1);
  const char mid_hi = hi_nines ? hi[d] : static_cast<char>(hi[d] - 1);
  if (mid_lo <= mid_hi) {
    alts.push_back(absl::StrCat("[", std::string(1, mid_lo),
                                mid_hi > mid_lo ? absl::StrCat("-", std::string(1, mid_hi)) : "",
                                "]", any_rest));
  }
  if (!hi_nines) {
    alts.push_back(absl::StrCat("\"", std::string(1, hi[d]), "\" ",
                                DigitRange(std::string(rest, '0'), hi_rest)));
  }
  return absl::StrCat(prefix, prefix.empty() ? "" : " ", Alternatives(alts));
}

// Every integer in [lo, hi] (0 <= lo <= hi), in decimal without leading zeros.
std::string UnsignedRange(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  int64_t low = lo;
  for (int len = 1; len <= 17 && low <= hi; ++len) {
    int64_t top = 9;
    for (int i = 1; i < len; ++i) top = top * 10 + 9;
    if (low > top) continue;
    const int64_t high = std::min(hi, top);
    alts.push_back(DigitRange(std::to_string(low), std::to_string(high)));
    low = top + 1;
  }
  return Alternatives(alts);
}

// Decimals (no exponent) y with lo <(=) y <(=) hi, 0 <= lo, integer bounds; `hi` < 0: unbounded
// (up to 16 integer digits). Empty when there is none.
std::vector<std::string> NonNegativeDecimals(int64_t lo, bool lo_ex, int64_t hi, bool hi_ex) {
  constexpr absl::string_view kAnyFraction = "( \".\" [0-9]{1,16} )?";
  constexpr absl::string_view kZeroFraction = "( \".\" \"0\"{1,16} )?";
  constexpr absl::string_view kNonZeroFraction = "\".\" [0-9]{0,15} [1-9] [0-9]{0,15}";
  std::vector<std::string> alts;
  const std::string lo_text = absl::StrCat("\"", lo, "\"");
  if (hi >= 0 && lo > hi) return alts;
  if (hi >= 0 && lo == hi) {
    if (!lo_ex && !hi_ex) alts.push_back(absl::StrCat(lo_text, " ", kZeroFraction));
    return alts;
  }
  if (lo_ex) alts.push_back(absl::StrCat(lo_text, " ", kNonZeroFraction));
  const int64_t mid_lo = lo_ex ? lo + 1 : lo;
  const int64_t mid_hi = hi < 0 ? kMaxRangeMagnitude : hi - 1;
  if (mid_lo <= mid_hi) {
    alts.push_back(absl::StrCat(UnsignedRange(mid_lo, mid_hi), " ", kAnyFraction));
  }
  if (hi >= 0 && !hi_ex) alts.push_back(absl::StrCat("\"", hi, "\" ", kZeroFraction));
  return alts;
}

}  // namespace

std::string IntegerRangeGbnf(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (lo < 0) alts.push_back(absl::StrCat("\"-\" ", UnsignedRange(hi < 0 ? -hi : 1, -lo)));
  if (hi >= 0) alts.push_back(UnsignedRange(std::max<int64_t>(lo, 0), hi));
  return Alternatives(alts);
}

std::string DecimalRangeGbnf(std::optional<int64_t> lo, bool lo_exclusive,
                             std::optional<int64_t> hi, bool hi_exclusive) {
  std::vector<std::string> alts;
  if (!hi || *hi > 0 || (*hi == 0 && !hi_exclusive)) {  // x >= 0
    const bool from_zero = !lo || *lo < 0;
    alts = NonNegativeDecimals(from_zero ? 0 : *lo, from_zero ? false : lo_exclusive, hi ? *hi : -1,
                               hi_exclusive);
  }
  if (!lo || *lo < 0) {  // x = -y with y > 0
    const bool to_zero = !hi || *hi >= 0;
    for (std::string& alt : NonNegativeDecimals(to_zero ? 0 : -*hi, to_zero ? true : hi_exclusive,
                                                lo ? -*lo : -1, lo_exclusive)) {
      alts.push_back(absl::StrCat("\"-\" ", alt));
    }
  }
  return alts.empty() ? "" : Alternatives(alts);
}

}  // namespace ss::grammar
