#include "coordinator/grammar/token_vocab.h"
#include "coordinator/tokenizer.h"

namespace ss::grammar {

TokenVocab TokenVocab::FromTokenizer(const Tokenizer& tok, std::vector<int32_t> stop_ids) {
  TokenVocab v;
  const int32_t n = tok.vocab_size();
  v.bytes.resize(n);
  v.kind.assign(n, Kind::kUnused);
  for (int32_t id = 0; id < n; ++id) {
    std::optional<std::string_view> b = tok.TokenBytes(id);
    if (!b.has_value()) continue;
    v.bytes[id] = std::string(*b);
    v.kind[id] = tok.IsAddedToken(id) ? Kind::kAdded : Kind::kNormal;
    if (v.kind[id] == Kind::kNormal && b->empty()) v.kind[id] = Kind::kUnused;
  }
  v.stop_ids = std::move(stop_ids);
  return v;
}

TokenVocab TokenVocab::FromTokenizer(const Tokenizer& tok, std::vector<int32_t> stop_ids,
                                     int32_t padded_size) {
  TokenVocab v = FromTokenizer(tok, std::move(stop_ids));
  if (padded_size > v.size()) {
    v.bytes.resize(padded_size);
    v.kind.resize(padded_size, Kind::kUnused);
  }
  return v;
}

}  // namespace ss::grammar
