#include "coordinator/api_keys.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ss {

absl::StatusOr<std::vector<std::string>> ParseApiKeys(absl::string_view text,
                                                      absl::string_view source) {
  std::vector<std::string> keys;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    for (absl::string_view key : absl::StrSplit(line, ',')) {
      key = absl::StripAsciiWhitespace(key);
      if (key.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": line ", line_no,
                                                       ": empty API key (an empty entry between "
                                                       "commas)"));
      }
      for (char c : key) {
        const auto u = static_cast<unsigned char>(c);
        if (u <= 0x20 || u == 0x7f) {
          return absl::InvalidArgumentError(absl::StrCat(
              source, ": line ", line_no, ": an API key holds whitespace or a control character"));
        }
      }
      keys.emplace_back(key);
    }
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no API key (give at least one, or no key source at all)"));
  }
  return keys;
}

absl::StatusOr<std::vector<std::string>> ReadApiKeysFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--api_keys_file ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("--api_keys_file ", path, ": read error"));
  return ParseApiKeys(ss.str(), absl::StrCat("--api_keys_file ", path));
}

}  // namespace ss
