#include "coordinator/bench/bench_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ss::bench {
namespace {

using Json = nlohmann::json;

// Uniform integer in [floor(len*(1-r)), ceil(len*(1+r))], at least 1 (vLLM's range).
int64_t DrawLen(std::mt19937_64& rng, int64_t len, double r) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1 - r))));
  const int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(len * (1 + r))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

}  // namespace

TokenPool TokenPool::Default() {
  std::vector<int32_t> ids;
  for (int32_t i = 16; i <= 999; ++i) ids.push_back(i);
  return TokenPool(std::move(ids));
}

absl::StatusOr<TokenPool> TokenPool::FromTokenizer(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
  std::ifstream in(p);
  if (!in) return absl::NotFoundError(absl::StrCat("--tokenizer: cannot read ", p.string()));
  Json t = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (t.is_discarded() || !t.contains("model") || !t["model"].contains("vocab") ||
      !t["model"]["vocab"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer: ", p.string(), " is not a tokenizer.json with model.vocab"));
  }
  std::vector<int32_t> special;
  if (t.contains("added_tokens") && t["added_tokens"].is_array()) {
    for (const Json& a : t["added_tokens"]) {
      if (a.value("special", false) && a.contains("id")) special.push_back(a["id"].get<int32_t>());
    }
  }
  std::vector<int32_t> ids;
  for (const auto& [tok, id] : t["model"]["vocab"].items()) {
    if (!id.is_number_integer()) continue;
    const int32_t v = id.get<int32_t>();
    if (std::find(special.begin(), special.end(), v) == special.end()) ids.push_back(v);
  }
  std::sort(ids.begin(), ids.end());
  if (ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer: ", p.string(), " has no ordinary tokens"));
  }
  return TokenPool(std::move(ids));
}

int32_t TokenPool::Draw(std::mt19937_64& rng) const {
  return ids_[std::uniform_int_distribution<size_t>(0, ids_.size() - 1)(rng)];
}

std::vector<int32_t> TokenPool::Draw(std::mt19937_64& rng, int64_t n) const {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& id : out) id = Draw(rng);
  return out;
}

std::vector<Conversation> RandomDataset(const BenchOptions& o, const TokenPool& pool) {
  std::mt19937_64 rng(o.seed);
  const std::vector<int32_t> prefix = pool.Draw(rng, o.random_prefix_len);
  std::vector<Conversation> out(static_cast<size_t>(o.num_prompts));
  for (Conversation& c : out) {
    Turn t;
    const int64_t in_len = DrawLen(rng, o.random_input_len, o.random_range_ratio);
    t.output_len = DrawLen(rng, o.random_output_len, o.random_range_ratio);
    t.prompt_ids = prefix;
    const std::vector<int32_t> own = pool.Draw(rng, in_len);
    t.prompt_ids.insert(t.prompt_ids.end(), own.begin(), own.end());
    c.turns.push_back(std::move(t));
  }
  return out;
}

std::vector<Conversation> PrefixRepeatDataset(const BenchOptions& o, const TokenPool& pool) {
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<int32_t>> prefixes;
  for (int64_t i = 0; i < o.num_prefixes; ++i) prefixes.push_back(pool.Draw(rng, o.prefix_len));
  std::vector<Conversation> out(static_cast<size_t>(o.num_prompts));
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<int32_t> context = prefixes[i % prefixes.size()];
    for (int64_t k = 0; k < o.turns; ++k) {
      if (k > 0) {  // the previous turn's reply, then the user's next message
        const std::vector<int32_t> reply = pool.Draw(rng, o.prefix_output_len);
        context.insert(context.end(), reply.begin(), reply.end());
      }
      const std::vector<int32_t> suffix = pool.Draw(rng, o.suffix_len);
      context.insert(context.end(), suffix.begin(), suffix.end());
      Turn t;
      t.prompt_ids = context;
      t.output_len = o.prefix_output_len;
      out[i].turns.push_back(std::move(t));
    }
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

absl::StatusOr<std::vector<Conversation>> CustomDataset(const BenchOptions& o) {
  std::ifstream in(o.dataset_path);
  if (!in) return absl::NotFoundError(absl::StrCat("--dataset-path: cannot read ", o.dataset_path));
  std::vector<Turn> lines;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(o.dataset_path, ":", n, ": ");
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected a JSON object with \"prompt\""));
    }
    Turn t;
    const Json& p = j["prompt"];
    if (p.is_string()) {
      t.prompt_text = p.get<std::string>();
      if (t.prompt_text.empty()) return absl::InvalidArgumentError(where + "empty prompt");
    } else if (p.is_array() && !p.empty()) {
      for (const Json& id : p) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0) {
          return absl::InvalidArgumentError(where + "prompt ids must be non-negative integers");
        }
        t.prompt_ids.push_back(id.get<int32_t>());
      }
    } else {
      return absl::InvalidArgumentError(where + "prompt: expected a string or an array of ids");
    }
    t.output_len = o.custom_output_len;
    if (j.contains("output_tokens")) {
      if (!j["output_tokens"].is_number_integer() || j["output_tokens"].get<int64_t>() < 1) {
        return absl::InvalidArgumentError(where + "output_tokens: expected an integer >= 1");
      }
      t.output_len = j["output_tokens"].get<int64_t>();
    }
    lines.push_back(std::move(t));
  }
  if (lines.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset-path: ", o.dataset_path, " holds no prompts"));
  }
  std::vector<Conversation> out(static_cast<size_t>(o.num_prompts));
  for (size_t i = 0; i < out.size(); ++i) out[i].turns.push_back(lines[i % lines.size()]);
  return out;
}

absl::StatusOr<std::vector<Conversation>> BuildDataset(const BenchOptions& o,
                                                       const TokenPool& pool) {
  if (o.dataset_name == "random") return RandomDataset(o, pool);
  if (o.dataset_name == "prefix-repeat") return PrefixRepeatDataset(o, pool);
  return CustomDataset(o);
}

}  // namespace ss::bench
