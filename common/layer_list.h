// Command-line helpers shared by every splitserve binary: layer lists and expert slices as flags
// and config files spell them (the expert worker's and GPU worker's flags, the coordinator's
// cluster config), and dash-spelled flag names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ss {

// The largest layer id a list may name. Lists name layers of a model (DeepSeek-V4-Flash: 43 and
// the MTP block); the bound keeps a typo such as "0-11011111" from expanding into millions of
// entries (tests/fuzz/config_fuzz.cc feeds it such lists).
inline constexpr int kMaxLayerId = 4095;

// "0-42,43" -> {0..42, 43} in the order written. Spaces around items are ignored. Errors
// (InvalidArgument, starting with `what` and naming the item): an empty list or item, a
// non-number, a negative id or one above kMaxLayerId, a range whose end is below its start, an
// id listed twice.
absl::StatusOr<std::vector<int>> ParseLayerList(absl::string_view spec,
                                                absl::string_view what = "--layers");

// The inverse for lists of ids: {0..42, 43} -> "0-43"; each run of consecutive ids, in the
// order given, as "a-b" (or "a" alone), joined with ",". Also for CPU lists ("0-27,32-59").
std::string FormatIdList(const std::vector<int>& ids);

// "i/n" -> {i, n} with n >= 1 and 0 <= i < n.
absl::StatusOr<std::pair<int, int>> ParseSlice(absl::string_view spec,
                                               absl::string_view what = "--slice");

// Rewrites "--some-flag[=v]" to "--some_flag[=v]" in place (absl flag names are identifiers),
// up to a "--" terminator. Values and single-dash arguments are left alone. Every splitserve
// binary accepts both spellings.
void NormalizeFlagDashes(int argc, char** argv);

}  // namespace ss
