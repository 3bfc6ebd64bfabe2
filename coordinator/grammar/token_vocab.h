// A vocabulary as the grammar engine sees it: every id's bytes and whether the id is an ordinary
// vocab token (its bytes are text the grammar must consume), an added (special) token (reachable
// only through a token terminal such as `<｜DSML｜>`), or unused (never allowed). Plus the stop
// ids, allowed exactly where the grammar's root may end.
//
// A plain value: build it once per model and share it (as shared_ptr<const TokenVocab>) between
// every compiled grammar; it is never modified afterwards, so any thread may read it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ss {
class Tokenizer;
}

namespace ss::grammar {

struct TokenVocab {
  enum class Kind : uint8_t { kUnused, kNormal, kAdded };
  std::vector<std::string> bytes;  // per id (empty for unused)
  std::vector<Kind> kind;          // per id, same size as `bytes`
  std::vector<int32_t> stop_ids;  // e.g. <｜end▁of▁sentence｜>; ids outside the vocab are ignored

  int32_t size() const { return static_cast<int32_t>(bytes.size()); }

  // From the tokenizer (TokenBytes / IsAddedToken for every id < vocab_size()). Defined in
  // token_vocab_tokenizer.cc, the only part of ss_grammar that needs ss_tokenizer.
  static TokenVocab FromTokenizer(const Tokenizer& tok, std::vector<int32_t> stop_ids);
  // The same, padded with unused ids up to `padded_size` (the model's logit count, e.g. 129,280
  // for DeepSeek-V4 whose tokenizer uses fewer ids) so masks cover every logit.
  static TokenVocab FromTokenizer(const Tokenizer& tok, std::vector<int32_t> stop_ids,
                                  int32_t padded_size);
};

}  // namespace ss::grammar
