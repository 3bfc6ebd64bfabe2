// The requests of a `splitserve bench serve` run: conversations of one or more turns, each turn a
// prompt (token ids, or text for a custom dataset's text lines) and a max_tokens. Every dataset is
// a pure function of its options and seed.
//
//   random         vLLM's: input lengths uniform in [len*(1-r), len*(1+r)] (integers, both ends
//                  included), output lengths likewise, after a --random-prefix-len prefix shared
//                  by every prompt; one turn each.
//   prefix-repeat  vLLM's prefix_repetition: --prefix-repetition-num-prefixes prefixes, each
//                  shared by num_prompts / num_prefixes conversations (round robin, then
//                  shuffled), each with its own suffix. With --prefix-repetition-turns T > 1,
//                  turn k+1's prompt is turn k's prompt + output-len fresh ids standing for the
//                  reply + a new suffix, so each turn extends the previous one's context (the
//                  prefix-cache workload of a chat).
//   custom         vLLM's: a JSONL file, each line {"prompt": "text" or [ids], optional
//                  "output_tokens": n}; the first num_prompts lines, taken again from the top
//                  when the file has fewer.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/bench/bench_options.h"

namespace ss::bench {

struct Turn {
  std::vector<int32_t> prompt_ids;  // used when prompt_text is empty
  std::string prompt_text;          // a custom dataset's text prompt (the server tokenizes it)
  int64_t output_len = 0;           // max_tokens
  int64_t PromptLen() const { return static_cast<int64_t>(prompt_ids.size()); }
};

struct Conversation {
  std::vector<Turn> turns;  // sent one after another, each when the previous one finished
};

// The ids random prompts are drawn from.
class TokenPool {
 public:
  // Ids 16..999: ordinary tokens of every DeepSeek-V4 tokenizer and of the bundled tiny model's
  // (whose ids 0..2 and 1012..1023 are special).
  static TokenPool Default();
  // The non-special ids of a tokenizer.json (model.vocab less added_tokens marked special);
  // `path` may be a directory holding tokenizer.json.
  static absl::StatusOr<TokenPool> FromTokenizer(const std::string& path);

  int32_t Draw(std::mt19937_64& rng) const;
  std::vector<int32_t> Draw(std::mt19937_64& rng, int64_t n) const;
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  explicit TokenPool(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
  std::vector<int32_t> ids_;
};

std::vector<Conversation> RandomDataset(const BenchOptions& o, const TokenPool& pool);
std::vector<Conversation> PrefixRepeatDataset(const BenchOptions& o, const TokenPool& pool);
absl::StatusOr<std::vector<Conversation>> CustomDataset(const BenchOptions& o);

// The dataset --dataset-name names.
absl::StatusOr<std::vector<Conversation>> BuildDataset(const BenchOptions& o,
                                                       const TokenPool& pool);

}  // namespace ss::bench
