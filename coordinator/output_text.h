// Generated ids -> the text a response returns: streaming detokenisation (StreamDecoder), the
// request's stop strings, and the logprob entries that go with the returned text. The gateway
// (openai_server.h) runs every generation through one OutputText, streaming or not, so both
// return the same text for the same ids however the engine groups them into events.
//
// Stop strings (OpenAI `stop`, applied to the decoded text, before reasoning / tool-call
// parsing): generation ends at the first place where a stop string has been completed. Of the
// stop strings that end there, the earliest-starting (longest) one is cut. The text before it is
// returned; the stop string and everything after it are not. While text could still turn out to
// be the start of a stop string (its longest suffix that is a prefix of some stop string), it is
// held back, so a stream never emits text that a later id makes part of a stop string. Empty stop
// strings are ignored. Stop strings are matched on bytes: they and the decoded text are valid
// UTF-8, so a match and a held-back suffix always start on a character boundary.
//
// Thread-compatibility: one object per generation, used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/engine.h"
#include "coordinator/tokenizer.h"

namespace ss {

// Finds stop strings in text that arrives in pieces of any size.
class StopStringMatcher {
 public:
  // include_stop: the matched stop string is returned with the text before it (vLLM's
  // include_stop_str_in_output).
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop = false);

  // Appends `text` and returns what became certain not to be part of a stop string. Once a stop
  // string is found, returns the text before it (and the stop string with include_stop) and sets
  // stopped(); later calls return "".
  std::string Feed(std::string_view text);
  // The end of the text (no more pieces): releases what was held back. Idempotent.
  std::string Finish();

  bool stopped() const { return stopped_; }
  // The stop string that matched, once stopped().
  const std::string& matched() const { return matched_; }
  size_t held_bytes() const { return buffer_.size(); }

 private:
  std::vector<std::string> stops_;  // non-empty
  bool include_stop_ = false;
  std::string buffer_;  // held back: a prefix of some stop string
  std::string matched_;
  bool stopped_ = false;
};

// One generated id's logprobs, with the byte offset in the returned text where its text starts.
struct OutputLogprob {
  int32_t id = 0;
  TokenLogprobs logprobs;
  size_t text_offset = 0;
};

class OutputText {
 public:
  // The tokenizer must outlive this object. The text of the first `min_tokens` ids is returned
  // as it is: stop strings match only in the text that follows (vLLM checks no stop string before
  // min_tokens ids were generated).
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
             bool include_stop = false, size_t min_tokens = 0);

  // What became certain with one call: text to append to the response, and the logprob entries
  // of the ids whose text is now wholly returned (an id whose text is empty, e.g. the first
  // half of a character, goes with the text before it).
  struct Piece {
    std::string text;
    std::vector<OutputLogprob> logprobs;
    void Append(Piece other);
  };

  // Takes an event's ids, one at a time, with their logprobs (`logprobs` is empty or parallel to
  // `ids`). Once a stop string has matched, the remaining ids are not taken. Ids the tokenizer
  // does not know add no text.
  Piece Add(std::span<const int32_t> ids, std::span<const TokenLogprobs> logprobs);
  // The end of generation: flushes the decoder (an unfinished character becomes U+FFFD, which may
  // still complete a stop string) and releases everything held back. Idempotent.
  Piece Finish();

  bool stopped() const { return matcher_.stopped(); }
  // The stop string that ended the text, once stopped().
  const std::string& stop_string() const { return matcher_.matched(); }
  // Ids taken: all of them, or up to and including the one that completed a stop string.
  size_t tokens() const { return tokens_; }

 private:
  struct PendingLogprob {
    OutputLogprob entry;
    size_t end = 0;  // where the id's text ends in the decoded text
  };
  // Moves the pending entries now covered by the returned text into `out`.
  void Release(Piece* out);

  StreamDecoder decoder_;
  StopStringMatcher matcher_;
  size_t fed_ = 0;       // bytes of decoded text given to the matcher
  size_t returned_ = 0;  // bytes of text returned (released by the matcher)
  size_t tokens_ = 0;
  size_t min_tokens_ = 0;
  bool finished_ = false;
  std::vector<PendingLogprob> pending_;
};

}  // namespace ss
