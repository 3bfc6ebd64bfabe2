// Fuzz target: the DeepSeek tokenizer (coordinator/tokenizer.h: the V3 tokenizer.json with the V4
// special tokens) on arbitrary text and ids. Invariants: nothing crashes; valid UTF-8 encodes and
// decodes back to itself (byte-level BPE is lossless), with or without plain-text ranges, and a
// plain-text range holds no added-token id; invalid UTF-8 is an error, not a crash;
// the stream decoder's pieces are whole characters and concatenate to Decode of the same ids.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/tokenizer.h"
#include "coordinator/utf8.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const ss::Tokenizer& Tok() {
  static const std::unique_ptr<ss::Tokenizer> tok = [] {
    auto t = ss::Tokenizer::Load(SS_TOKENIZER_JSON);
    ss::fuzz::Require(t.ok(), "loading tokenizer.json");
    auto added = ss::ReadAddedTokensFile(SS_TOKENIZER_DATA "/v4_added_tokens.json");
    ss::fuzz::Require(added.ok(), "reading v4_added_tokens.json");
    ss::fuzz::Require((*t)->AddSpecialTokens(*added).ok(), "adding the V4 special tokens");
    return std::move(*t);
  }();
  return *tok;
}

bool Valid(std::string_view s) { return ss::utf8::FirstInvalid(s) == std::string_view::npos; }

}  // namespace

// libFuzzer calls this once before the first input: loading the 7.8 MB tokenizer.json (slow under
// the sanitizers) must not count against the first input's timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)Tok();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ss::Tokenizer& tok = Tok();
  ss::fuzz::Input in(data, size);
  const uint8_t what = in.Byte();
  if (what & 1) {  // text -> ids -> text
    const std::string_view text = in.Rest();
    auto ids = tok.Encode(text);
    if (!Valid(text)) {
      ss::fuzz::Require(!ids.ok(), "invalid UTF-8 was encoded");
      return 0;
    }
    ss::fuzz::Require(ids.ok(), "valid UTF-8 failed to encode");
    auto back = tok.Decode(*ids);
    ss::fuzz::Require(back.ok() && *back == text, "Decode(Encode(text)) != text");
    // Plain-text ranges (bit 1: the middle third; else the whole text): still lossless, and no
    // added-token id inside the whole-text range.
    const std::pair<size_t, size_t> range =
        what & 2 ? std::make_pair(text.size() / 3, 2 * text.size() / 3)
                 : std::make_pair(size_t{0}, text.size());
    auto plain = tok.Encode(text, {&range, 1});
    ss::fuzz::Require(plain.ok(), "valid UTF-8 with a plain-text range failed to encode");
    back = tok.Decode(*plain);
    ss::fuzz::Require(back.ok() && *back == text, "Decode(Encode(text, plain)) != text");
    if (!(what & 2)) {
      for (int32_t id : *plain) {
        ss::fuzz::Require(!tok.IsAddedToken(id), "an added token inside a plain-text range");
      }
    }
    return 0;
  }
  // ids (two bytes each, some beyond the vocabulary) -> Decode and the stream decoder
  std::vector<int32_t> ids;
  while (in.left() >= 2 && ids.size() < 512) {
    const int32_t hi = in.Byte(), lo = in.Byte();
    ids.push_back(((hi << 8) | lo) * 3);  // 0 .. 196605 covers the 129280 ids and beyond
  }
  auto whole = tok.Decode(ids);
  ss::StreamDecoder stream(tok);
  std::string streamed;
  bool all_known = true;
  for (int32_t id : ids) {
    auto piece = stream.Add(id);
    if (!piece.ok()) {
      all_known = false;
      continue;
    }
    ss::fuzz::Require(Valid(*piece), "a stream-decoder piece is not valid UTF-8");
    streamed += *piece;
  }
  streamed += stream.Flush();
  ss::fuzz::Require(Valid(streamed), "the stream decoder's output is not valid UTF-8");
  ss::fuzz::Require(whole.ok() == all_known, "Decode and the stream decoder disagree on the ids");
  if (whole.ok()) {
    ss::fuzz::Require(*whole == streamed, "streamed text != Decode of the same ids");
  }
  return 0;
}
