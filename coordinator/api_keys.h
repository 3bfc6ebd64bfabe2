// API keys for the OpenAI gateway (GatewayConfig::api_keys): read from a file or the environment,
// never from argv, where every local user sees them (`ps`, /proc/PID/cmdline).
//
// Sources (the coordinator takes at most one; neither: no authentication):
//   --api_keys_file PATH        the file's text
//   SPLITSERVE_API_KEYS         the environment variable's value (the project's prefix, and plural
//                               as it holds a list; vLLM's VLLM_API_KEY holds one key)
// Format: keys separated by newlines or commas; surrounding whitespace is trimmed; blank lines and
// lines starting with '#' are skipped. Errors (the service must never start open by accident when
// keys were meant): an empty entry between commas (",", "a,,b"), a key holding whitespace or a
// control character, no key at all.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ss {

inline constexpr char kApiKeysEnv[] = "SPLITSERVE_API_KEYS";

// Parses `text` (format above); `source` names it in errors ("--api_keys_file F", the variable).
// Error messages never include a key.
absl::StatusOr<std::vector<std::string>> ParseApiKeys(absl::string_view text,
                                                      absl::string_view source);

// Reads and parses the file at `path`.
absl::StatusOr<std::vector<std::string>> ReadApiKeysFile(const std::string& path);

}  // namespace ss
