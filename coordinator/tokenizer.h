// The DeepSeek-V4 tokenizer: byte-level BPE read from a Hugging Face `tokenizer.json`
// (spec/dsv4.md §6.1), reproducing `tokenizers`' `encode(text, add_special_tokens=False)` and
// `decode(ids, skip_special_tokens=False)` id for id (checked against tests/data/tokenizer/).
//
// Encoding, in the order `tokenizers` applies it:
//   1. Added tokens are cut out of the text as whole strings before anything else, leftmost
//      longest match first: first those with `normalized: false` (and every token given to
//      AddSpecialTokens), then, in the gaps, those with `normalized: true`. The normalizer must be
//      absent or an empty Sequence, so both passes see the raw text. `<｜User｜>` cannot be rebuilt
//      from merges: without this step it becomes many ids. `lstrip`, `rstrip` and `single_word`
//      must be false (as in every DeepSeek file). Encode's `plain_text` ranges are left out of this
//      step (chat message content is text: see Encode).
//   2. The gaps go through the pre-tokenizer's `Split` steps in order. Each regex is taken verbatim
//      from the file and compiled with PCRE2 (UTF + UCP, JIT when the library has it); a `String`
//      pattern is matched literally. A regex sees one piece at a time, as in `tokenizers`, so a
//      look-ahead stops at the piece's end. Behaviours: `Isolated` (matches and gaps are pieces)
//      and `Removed` (matches are dropped), with `invert` swapping matches and gaps; any other
//      behaviour is a load error. Empty matches split nothing.
//   3. The last pre-tokenizer step must be `ByteLevel` with `add_prefix_space: false` and
//      `use_regex: false`: each piece's bytes map to the GPT-2 byte alphabet (a space is `Ġ`).
//   4. BPE: start from one symbol per byte and repeatedly merge the adjacent pair with the lowest
//      merge rank, leftmost first (a heap, so O(n log n) in the piece length however long the
//      piece). `ignore_merges: true` is honoured; dropout, unk/fallback, subword prefix/suffix are
//      load errors.
// No BOS or EOS is added (the post-processor is ignored; the chat encoder writes BOS as text).
//
// Input text must be valid UTF-8: Encode returns InvalidArgument naming the byte offset of the
// first invalid sequence (JSON clients cannot send anything else; `tokenizers` takes only `str`).
//
// Decoding concatenates each id's bytes (an added token's content as written; a vocab token's
// byte-alphabet characters mapped back to bytes) and converts the result with utf8::Lossy
// (coordinator/utf8.h), as `tokenizers` does: each maximal invalid subsequence becomes one
// U+FFFD. An id can end inside a character (😀 is two ids), so a streaming client must use
// StreamDecoder, never Decode id by id.
//
// Thread-safety: after Load and any AddSpecialTokens calls, a Tokenizer is immutable; Encode,
// Decode and every accessor are const and may run on many threads at once. Each Encode call keeps
// its own scratch and a memo of the pieces it has already encoded (at most 65536 entries, pointing
// into the call's own input and output), freed when it returns: nothing is cached across calls,
// so memory does not grow with traffic.
//
// Cost: time is linear in the text, except BPE over one piece: O(n log n) in the piece's length,
// which only a run without digits, spaces or punctuation reaches (bench/tokenizer_scaling_bench
// prints the time per byte from 10 KB to 8 MB against the 10 KB one). The rates are in
// bench/RESULTS.md, "Tokenizer encode throughput" and "Tokenizer scaling".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ss {

// A token matched as a whole string before pre-tokenisation.
struct AddedToken {
  std::string content;
  int32_t id = 0;
};

// Reads a list of extra special tokens. Two layouts are accepted:
//   * a JSON array of {"content": str, "id": int};
//   * the V4 table of tests/data/tokenizer/v4_added_tokens.json: the entries of "already_in_v3"
//     and those of "added" whose "status" is "v4". Entries with any other status (uncertain ids)
//     and the "fillers_used_for_cases_v4" (not part of the V4 specification) are skipped.
// Errors name the file and the entry.
absl::StatusOr<std::vector<AddedToken>> ReadAddedTokensFile(const std::string& path);

class Tokenizer {
 public:
  // Reads and validates `path` (see the file comment for what is supported). Errors name the file
  // and the field at fault; nothing in the file can crash the process.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // The same from the file's contents; `label` names it in errors. Used by tests.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json,
                                                             const std::string& label);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Adds special tokens at fixed ids (the DeepSeek-V4 table on top of the V3 file). They join
  // the first added-token pass (like `normalized: false` tokens). A token already present with
  // the same id is accepted; a content already mapped to another id, or an id already used by
  // another token, is an error and leaves the tokenizer unchanged. Not thread-safe: call before
  // sharing the tokenizer.
  absl::Status AddSpecialTokens(std::span<const AddedToken> tokens);

  // Token ids of `text`, no BOS added. Errors only on invalid UTF-8 or a regex engine failure
  // (e.g. PCRE2's resource limits), each naming the cause. Every added token's string in the
  // text becomes its id: for text the caller wrote as a whole (a raw completion prompt, /tokenize
  // text), as `tokenizers` and vLLM do.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;

  // [begin, end) byte ranges of a text, sorted and disjoint.
  using PlainText = std::span<const std::pair<size_t, size_t>>;
  // The same, except that added tokens are matched only where they lie wholly outside
  // `plain_text`: inside those ranges every byte is ordinary text, pre-tokenised and BPE'd with
  // its neighbours as usual (a piece may cross a range's edge), so an added token's string there
  // never becomes its id. For chat prompts, whose message content is text (chat_encoding.h,
  // Prompt). Ranges not sorted, disjoint and inside the text are an InvalidArgument. Cost as
  // Encode's, plus O(log ranges) at each byte that may start an added token.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, PlainText plain_text) const;

  // Text of `ids` (lossy UTF-8, see above). An id outside [0, vocab_size()) or one that no token
  // uses is an InvalidArgument naming the id and its position.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const;

  // The pieces BPE runs on, after added-token matching (each added token is a piece of its own)
  // and the Split steps, as views into `text`. Fails as Encode does. For tests and benchmarks.
  absl::StatusOr<std::vector<std::string_view>> PreTokenize(std::string_view text) const;

  // One past the largest id of any token (vocab or added). Ids below it may still be unused.
  int32_t vocab_size() const { return static_cast<int32_t>(id_bytes_.size()); }

  // Id of a token as `tokenizers`' token_to_id names it: an added token's content, or a vocab
  // entry in the byte alphabet ("Ġworld", not " world").
  std::optional<int32_t> TokenId(std::string_view token) const;

  // The bytes `id` decodes to (possibly an incomplete UTF-8 sequence), or nullopt for an id that
  // no token uses. Views stay valid while the tokenizer lives and is not modified.
  std::optional<std::string_view> TokenBytes(int32_t id) const;

  // Whether `id` is an added token (matched as a whole string, never produced by BPE).
  bool IsAddedToken(int32_t id) const;

  // Opaque pieces of the implementation (defined in the .cc).
  struct SplitStep;   // one compiled pre-tokenizer Split
  struct Trie;        // added-token matcher
  struct BpeScratch;  // per-call BPE buffers

 private:
  Tokenizer();
  absl::Status Parse(std::string_view json, const std::string& label);

  template <typename Sink>
  absl::Status ForEachPiece(std::string_view text, PlainText plain, Sink&& sink) const;
  void Bpe(std::string_view piece, BpeScratch& s, std::vector<int32_t>* out) const;
  void RebuildTries();

  // Every id's bytes; empty with has_token_[id] false for unused ids.
  std::vector<std::string> id_bytes_;
  std::vector<bool> has_token_;
  std::vector<bool> is_added_;
  // Vocab token (byte-alphabet string) -> id, for TokenId and ignore_merges.
  absl::flat_hash_map<std::string, int32_t> vocab_;
  // Added token content -> (id, normalized).
  absl::flat_hash_map<std::string, std::pair<int32_t, bool>> added_;
  // (left id << 32 | right id) -> (rank << 32 | merged id).
  absl::flat_hash_map<uint64_t, uint64_t> merges_;
  int32_t byte_id_[256] = {};      // vocab id of each single byte
  std::string byte_to_char_[256];  // GPT-2 byte alphabet, UTF-8 encoded
  bool ignore_merges_ = false;
  std::vector<std::unique_ptr<SplitStep>> splits_;
  std::unique_ptr<Trie> raw_trie_;         // normalized == false added tokens
  std::unique_ptr<Trie> normalized_trie_;  // normalized == true added tokens
};

// Incremental detokeniser for one output stream: feed ids as they are sampled, get back only
// whole UTF-8 characters; bytes of an unfinished character wait for the next id. The
// concatenation of every Add result and the final Flush equals Decode of all the ids. Not
// thread-safe (one per sequence); the tokenizer must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Text that became complete with `id` (often empty for the first half of a character). An
  // unknown id is an error and changes nothing.
  absl::StatusOr<std::string> Add(int32_t id);

  // Whatever is left (an unfinished character becomes U+FFFD), and starts over.
  std::string Flush();

  // Bytes held back, waiting for the rest of a character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace ss
