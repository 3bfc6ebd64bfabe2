// Token mask time at the DeepSeek-V4 vocabulary (129,280 logits): a JSON-schema grammar (what
// llama.cpp's json-schema-to-grammar writes for an object with string, integer, enum and
// array-of-string fields) drives a fixed valid document token by token; every step's
// FillNextTokenBitmask is timed. The baseline, measured in the same run at a few steps, is the
// naive mask: a copy of the matcher tries AcceptToken for every id (no cache, no shared prefixes);
// also shown, the sorted-vocabulary walk without the mask cache (CompileOptions with no budget).
// Also a generic JSON grammar (recursive value/object/array) on the same document.
//
//   grammar_mask_bench [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/grammar/compiled_grammar.h"
#include "coordinator/grammar/grammar_matcher.h"
#include "coordinator/grammar/token_vocab.h"
#include "coordinator/tokenizer.h"

namespace {

using namespace ss::grammar;  // NOLINT
using Clock = std::chrono::steady_clock;

constexpr char kSchemaGbnf[] =
    R"(root ::= "{" space name-kv "," space age-kv "," space role-kv "," space tags-kv ( "," space email-kv )? "}" space
name-kv ::= "\"name\"" space ":" space string
age-kv ::= "\"age\"" space ":" space integer
role-kv ::= "\"role\"" space ":" space role
role ::= ("\"admin\"" | "\"user\"" | "\"guest\"") space
tags-kv ::= "\"tags\"" space ":" space tags
tags ::= "[" space ( string ( "," space string )* )? "]" space
email-kv ::= "\"email\"" space ":" space string
string ::= "\"" char* "\"" space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= ("-"? integral-part) space
integral-part ::= [0] | [1-9] [0-9]{0,15}
space ::= | " " | "\n" [ \t]{0,20}
)";

constexpr char kAnyJsonGbnf[] = R"(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null") space
object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? "}" space
array ::= "[" space ( value ("," space value)* )? "]" space
string ::= "\"" char* "\"" space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? space
space ::= | " " | "\n" [ \t]{0,20}
)";

constexpr char kDoc[] =
    "{\"name\": \"Zoë Smith-Jones, head of the data platform team (Zürich office)\", "
    "\"age\": 42, \"role\": \"admin\", \"tags\": [\"machine learning\", \"日本語のテキスト\", "
    "\"on-call \\\"primary\\\"\", \"x\\u00e9\"],\n  \"email\": \"zoe.smith-jones@example.com\"}";

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

int Run(const char* label, const char* gbnf, const ss::Tokenizer& tok,
        const std::shared_ptr<const TokenVocab>& vocab, int reps) {
  // Compile time: the best of 3 (the first compile at a vocabulary also sorts it).
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g;
  double compile_us = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto t0 = Clock::now();
    g = CompileGrammar(gbnf, vocab);
    compile_us = std::min(compile_us, Us(Clock::now() - t0));
  }
  if (!g.ok()) {
    std::fprintf(stderr, "%s: %s\n", label, std::string(g.status().message()).c_str());
    return 1;
  }
  auto ids = tok.Encode(kDoc);
  if (!ids.ok()) return 1;
  const int32_t n = vocab->size();
  std::vector<uint32_t> mask((n + 31) / 32);
  GrammarMatcher m(*g);
  std::vector<double> us;
  double accept_us = 0;
  std::vector<size_t> base_steps = {0, ids->size() / 4, ids->size() / 2, 3 * ids->size() / 4};
  double base_us = 0, fast_at_base_us = 0, trie_us = 0;
  // The sorted-vocabulary walk alone: the same grammar with no mask cache (every node uncached).
  CompileOptions no_cache;
  no_cache.mask_cache_budget = 0;
  auto g_trie = CompileGrammar(gbnf, vocab, no_cache);
  if (!g_trie.ok()) return 1;
  GrammarMatcher trie_m(*g_trie);
  int allowed_total = 0;
  for (size_t i = 0; i < ids->size(); ++i) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      auto a = Clock::now();
      m.FillNextTokenBitmask(mask);
      best = std::min(best, Us(Clock::now() - a));
    }
    us.push_back(best);
    for (uint32_t w : mask) allowed_total += __builtin_popcount(w);
    if (std::find(base_steps.begin(), base_steps.end(), i) != base_steps.end()) {
      auto a = Clock::now();
      std::vector<uint32_t> naive((n + 31) / 32, 0);
      for (int32_t id = 0; id < n; ++id) {
        GrammarMatcher c = m;
        if (c.AcceptToken(id)) naive[id / 32] |= 1u << (id % 32);
      }
      base_us += Us(Clock::now() - a);
      fast_at_base_us += best;
      std::vector<uint32_t> trie_mask((n + 31) / 32);
      a = Clock::now();
      trie_m.FillNextTokenBitmask(trie_mask);
      trie_us += Us(Clock::now() - a);
      if (trie_mask != mask) {
        std::fprintf(stderr, "%s: uncached mask differs at step %zu\n", label, i);
        return 1;
      }
      if (naive != mask) {
        std::fprintf(stderr, "%s: mask differs from the naive one at step %zu\n", label, i);
        return 1;
      }
    }
    auto a = Clock::now();
    const bool accepted = m.AcceptToken((*ids)[i]);
    accept_us += Us(Clock::now() - a);
    if (!accepted || !trie_m.AcceptToken((*ids)[i])) {
      std::fprintf(stderr, "%s: token %zu rejected\n", label, i);
      return 1;
    }
  }
  double mean = 0;
  for (double u : us) mean += u;
  mean /= static_cast<double>(us.size());
  std::printf(
      "%-10s compile (best of 3) %.1f ms (%zu cached nodes, %zu uncertain entries, %.1f MB); %zu "
      "steps, mean "
      "%zu allowed ids; AcceptToken mean %.2f us\n",
      label, 1e-3 * compile_us, (*g)->cached_nodes(), (*g)->uncertain_total(),
      1e-6 * static_cast<double>((*g)->mask_cache_bytes()), us.size(),
      static_cast<size_t>(allowed_total / static_cast<int>(us.size())),
      accept_us / static_cast<double>(us.size()));
  std::printf(
      "%-10s FillNextTokenBitmask us: mean %.1f p50 %.1f p99 %.1f max %.1f\n"
      "%-10s at %zu steps: naive (copy + AcceptToken per id) mean %.0f us = %.0fx the cached "
      "mask; sorted-vocab walk without the cache mean %.0f us = %.0fx\n",
      label, mean, Pct(us, 0.5), Pct(us, 0.99), Pct(us, 1.0), label, base_steps.size(),
      base_us / static_cast<double>(base_steps.size()), base_us / fast_at_base_us,
      trie_us / static_cast<double>(base_steps.size()), trie_us / fast_at_base_us);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  }
  auto tok = ss::Tokenizer::Load(SS_TOKENIZER_JSON);
  if (!tok.ok()) return 1;
  auto added = ss::ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");
  if (!added.ok() || !(*tok)->AddSpecialTokens(*added).ok()) return 1;
  const int32_t eos = (*tok)->TokenId("<｜end▁of▁sentence｜>").value_or(1);
  auto vocab = std::make_shared<const TokenVocab>(TokenVocab::FromTokenizer(**tok, {eos}, 129280));
  std::printf("vocab %d ids; best of %d calls per step\n", vocab->size(), reps);
  if (Run("schema", kSchemaGbnf, **tok, vocab, reps) != 0) return 1;
  if (Run("any-json", kAnyJsonGbnf, **tok, vocab, reps) != 0) return 1;
  return 0;
}
