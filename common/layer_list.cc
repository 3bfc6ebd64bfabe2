#include "common/layer_list.h"

#include <cstring>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace ss {
namespace {

absl::StatusOr<int> ParseLayerId(absl::string_view s, absl::string_view what) {
  int v = 0;
  if (!absl::SimpleAtoi(s, &v) || v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", s, "' is not a non-negative integer"));
  }
  if (v > kMaxLayerId) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": layer ", v, " is above the largest layer id ", kMaxLayerId));
  }
  return v;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseLayerList(absl::string_view spec, absl::string_view what) {
  std::vector<int> layers;
  std::set<int> seen;
  if (absl::StripAsciiWhitespace(spec).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty list"));
  }
  for (absl::string_view raw : absl::StrSplit(spec, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    if (item.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " '", spec, "': empty item"));
    }
    const size_t dash = item.find('-', 1);  // from 1: "-3" is a (negative) number, not a range
    int first = 0, last = 0;
    const std::string item_what = absl::StrCat(what, " item '", item, "'");
    if (dash == absl::string_view::npos) {
      ASSIGN_OR_RETURN(first, ParseLayerId(item, item_what));
      last = first;
    } else {
      ASSIGN_OR_RETURN(first, ParseLayerId(absl::StripAsciiWhitespace(item.substr(0, dash)),
                                               item_what));
      ASSIGN_OR_RETURN(last, ParseLayerId(absl::StripAsciiWhitespace(item.substr(dash + 1)),
                                              item_what));
      if (last < first) {
        return absl::InvalidArgumentError(
            absl::StrCat(item_what, ": the range ends before it starts"));
      }
    }
    for (int l = first; l <= last; ++l) {
      if (!seen.insert(l).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " '", spec, "': layer ", l, " is listed twice"));
      }
      layers.push_back(l);
    }
  }
  return layers;
}

absl::StatusOr<std::pair<int, int>> ParseSlice(absl::string_view spec, absl::string_view what) {
  const std::vector<absl::string_view> parts = absl::StrSplit(spec, '/');
  int i = 0, n = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &i) || !absl::SimpleAtoi(parts[1], &n)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", spec, "': expected i/n, e.g. 0/2"));
  }
  if (n < 1 || i < 0 || i >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", i, "/", n, ": need n >= 1 and 0 <= i < n"));
  }
  return std::make_pair(i, n);
}

void NormalizeFlagDashes(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* a = argv[i];
    if (std::strcmp(a, "--") == 0) return;
    if (std::strncmp(a, "--", 2) != 0) continue;
    for (char* p = a + 2; *p != '\0' && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
}

std::string FormatIdList(const std::vector<int>& ids) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ids[i]) : absl::StrCat(ids[i], "-", ids[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace ss
