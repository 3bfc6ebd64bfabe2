// Structured output for the OpenAI gateway (constrained decoding): what a request asks to
// constrain, as a grammar, and the engine's TokenConstraint (engine.h) that enforces it.
//
// Requests (at most one of them; two are a 400):
//   response_format  {"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema":
//                    …}} (OpenAI; `strict` or not, the schema is enforced), {"type": "text"}: none
//   structured_outputs (vLLM) {"json": schema or its JSON text, "regex": str, "choice": [str],
//                    "grammar": GBNF, "json_object": true}
//   guided_json, guided_regex, guided_choice, guided_grammar (vLLM's older spelling)
//   tool_choice      "required" or a named function (chat): the output is a DSML tool-call block
//                    calling the tools (one or more; one with parallel_tool_calls false; the
//                    named one once), arguments valid against each tool's parameters schema
//                    (grammar/dsml_tool_gbnf.h)
// Conversion: grammar/json_schema_gbnf.h (compact JSON, no whitespace between tokens),
// grammar/regex_gbnf.h; `grammar` is GBNF (llama.cpp's dialect, grammar/gbnf.h). A schema, regex
// or grammar that cannot be enforced is a 400 naming the field and the reason.
//
// Compiled grammars are cached (a bounded LRU keyed by the grammar text), so a repeated schema is
// compiled once. In thinking mode the constraint begins after the reasoning: until `</think>` is
// generated every ordinary id and `</think>` may come (EOS may not), then the grammar applies.
// ignore_eos and min_tokens > 0 cannot be combined with a constraint (a 400): both would hold
// back the end the grammar needs.
//
// Thread-safety: StructuredOutput is thread-safe (the gateway's request threads share it). A
// constraint belongs to one request (the engine calls it from one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "coordinator/grammar/compiled_grammar.h"
#include "coordinator/grammar/token_vocab.h"
#include "coordinator/openai_request.h"
#include "coordinator/tokenizer.h"

namespace ss::openai {

// A request's grammar and the field that asked for it (named in errors).
struct RequestedGrammar {
  std::string param;
  std::string gbnf;
};

class StructuredOutput {
 public:
  // `model_vocab`: the model's logit count (masks cover max(it, the tokenizer's ids)).
  // `cache_entries`: compiled grammars kept.
  StructuredOutput(const Tokenizer& tokenizer, int32_t model_vocab, size_t cache_entries = 64);

  // The grammar `body` asks for (see above), or nullopt. `tools`: the request's tools (chat),
  // read before the gateway moves them into the prompt. 400s name the field.
  absl::StatusOr<std::optional<RequestedGrammar>> RequestGrammar(const Json& body,
                                                                 const ToolChoice& choice,
                                                                 const Json* tools) const;

  // A fresh constraint for one request; `after_reasoning`: thinking mode (see above). Compiles
  // the grammar unless cached; one that does not compile is a 400 naming its field.
  absl::StatusOr<std::shared_ptr<TokenConstraint>> Constraint(const RequestedGrammar& requested,
                                                              bool after_reasoning);

  // The mask's 32-bit words: the vocabulary (the model's logits, or the tokenizer's ids if more)
  // rounded up to 32 ids.
  size_t mask_words() const { return static_cast<size_t>((vocab_->size() + 31) / 32); }

 private:
  std::shared_ptr<const grammar::TokenVocab> vocab_;
  grammar::GrammarCache cache_;
  std::vector<uint32_t> reasoning_mask_;  // every ordinary id and </think>
  int32_t think_end_ = -1;                // </think>, or -1 when the tokenizer has none
};

}  // namespace ss::openai
