#include "coordinator/tokenize_command.h"

#include <iostream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

using nlohmann::json;

constexpr char kUsage[] =
    "usage: splitserve tokenize --tokenizer FILE [--added-tokens FILE] [--decode]\n"
    "  reads JSON lines {\"text\": ...} on stdin, writes {\"ids\": [...]} per line\n"
    "  --decode: reads {\"ids\": [...]}, writes {\"text\": ...}\n";

struct Options {
  std::string tokenizer;
  std::string added_tokens;
  bool decode = false;
  bool help = false;  // --help / -h: nothing else was parsed
};

// InvalidArgument naming an unknown flag, a missing value or a missing --tokenizer.
absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    std::string_view name = a, value;
    bool has_value = false;
    if (const size_t eq = a.find('='); eq != std::string_view::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    if (name == "--help" || name == "-h") {
      o.help = true;
      return o;
    }
    if (name == "--decode" && !has_value) {
      o.decode = true;
      continue;
    }
    std::string* target = name == "--tokenizer"      ? &o.tokenizer
                          : name == "--added-tokens" ? &o.added_tokens
                                                     : nullptr;
    if (target == nullptr) {
      return absl::InvalidArgumentError("unknown argument '" + std::string(a) + "'");
    }
    if (!has_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(std::string(name) + " needs a value");
      value = argv[++i];
    }
    *target = std::string(value);
  }
  if (o.tokenizer.empty()) return absl::InvalidArgumentError("--tokenizer is required");
  return o;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// The output line for one input line.
json HandleLine(const Tokenizer& tok, bool decode, const std::string& line) {
  const json in = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded() || !in.is_object()) return {{"error", "not a JSON object"}};
  if (!decode) {
    auto t = in.find("text");
    if (t == in.end() || !t->is_string()) return {{"error", "'text' is missing or not a string"}};
    auto ids = tok.Encode(t->get_ref<const std::string&>());
    if (!ids.ok()) return {{"error", Message(ids.status())}};
    return {{"ids", *ids}};
  }
  auto a = in.find("ids");
  if (a == in.end() || !a->is_array()) return {{"error", "'ids' is missing or not an array"}};
  std::vector<int32_t> ids;
  for (const json& v : *a) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return {{"error", "id " + v.dump() + " is not a non-negative 32-bit integer"}};
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  auto text = tok.Decode(ids);
  if (!text.ok()) return {{"error", Message(text.status())}};
  return {{"text", *text}};
}

}  // namespace

int RunTokenizeCommand(int argc, char** argv, std::istream& in, std::ostream& out,
                       std::ostream& err) {
  const absl::StatusOr<Options> parsed = ParseArgs(argc, argv);
  if (!parsed.ok()) {
    err << "splitserve tokenize: " << Message(parsed.status()) << "\n" << kUsage;
    return 2;
  }
  const Options& o = *parsed;
  if (o.help) {
    out << kUsage;
    return 0;
  }
  auto tok = Tokenizer::Load(o.tokenizer);
  if (!tok.ok()) {
    err << "splitserve tokenize: " << Message(tok.status()) << "\n";
    return 1;
  }
  if (!o.added_tokens.empty()) {
    auto added = ReadAddedTokensFile(o.added_tokens);
    absl::Status st = added.ok() ? (*tok)->AddSpecialTokens(*added) : added.status();
    if (!st.ok()) {
      err << "splitserve tokenize: " << Message(st) << "\n";
      return 1;
    }
  }
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    json result = HandleLine(**tok, o.decode, line);
    if (auto e = result.find("error"); e != result.end()) {
      *e = "line " + std::to_string(n) + ": " + e->get<std::string>();
    }
    out << result.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    out.flush();
  }
  return 0;
}

}  // namespace ss
