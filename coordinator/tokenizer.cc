#include "coordinator/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/utf8.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

using nlohmann::json;

// This absl build has its own string_view, which StrCat needs.
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

constexpr int32_t kMaxId = 1 << 24;  // bounds the id -> token table a hostile file can request
constexpr size_t kMaxSeenPieces = 1 << 16;  // per-Encode memo of pieces already encoded

absl::Status Bad(const std::string& label, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(label, ": ", AV(what)));
}

// GPT-2's byte -> code point table: printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100.. in byte order.
std::array<uint32_t, 256> ByteAlphabet() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// The bytes a token string stands for: its characters mapped back through the byte alphabet, or
// the string itself if any character is outside the alphabet (as the ByteLevel decoder does).
std::string TokenToBytes(std::string_view token, const std::array<int, 324>& char_to_byte) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    const utf8::Step st = utf8::Next(p + i, token.size() - i);
    if (st.kind != utf8::Kind::kChar || st.len > 2) return std::string(token);
    const uint32_t cp = st.len == 1 ? p[i] : ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
    if (cp >= char_to_byte.size() || char_to_byte[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(char_to_byte[cp]));
    i += st.len;
  }
  return out;
}

// Field access that never throws: each returns an error naming `label` and `what`.
absl::StatusOr<std::string> GetString(const json& o, const char* key, const std::string& label,
                                      std::string_view what) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_string()) {
    return Bad(label, absl::StrCat(AV(what), ": '", key, "' is missing or not a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<int32_t> GetId(const json& v, const std::string& label, std::string_view what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId) {
    return Bad(label, absl::StrCat(AV(what), ": id ", v.dump(), " is not an integer in [0, ",
                                   kMaxId, ")"));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

// A boolean field that must be absent, null or `want`.
absl::Status ExpectFlag(const json& o, const char* key, bool want, const std::string& label,
                        std::string_view what) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null() || (it->is_boolean() && it->get<bool>() == want)) {
    return absl::OkStatus();
  }
  return Bad(label, absl::StrCat(AV(what), ": '", key, "' = ", it->dump(), " is not supported"));
}

// A field that must be absent or null (or an empty string).
absl::Status ExpectUnset(const json& o, const char* key, const std::string& label,
                         std::string_view what) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null() ||
      (it->is_string() && it->get_ref<const std::string&>().empty())) {
    return absl::OkStatus();
  }
  return Bad(label, absl::StrCat(AV(what), ": '", key, "' = ", it->dump(), " is not supported"));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return std::move(ss).str();
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

}  // namespace

struct Tokenizer::SplitStep {
  enum class Behavior { kIsolated, kRemoved };
  pcre2_code* code = nullptr;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  std::string pattern;  // for error messages
  ~SplitStep() { pcre2_code_free(code); }
};

// Byte trie over added-token contents; Match gives the longest token starting at a position.
struct Tokenizer::Trie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> node
    int32_t id = -1;
  };
  std::vector<Node> nodes = std::vector<Node>(1);
  bool first[256] = {};

  void Insert(std::string_view s, int32_t id) {
    int32_t n = 0;
    for (unsigned char c : s) {
      auto& next = nodes[n].next;
      auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
      if (it != next.end()) {
        n = it->second;
      } else {
        next.emplace_back(c, static_cast<int32_t>(nodes.size()));
        n = static_cast<int32_t>(nodes.size());
        nodes.emplace_back();
      }
    }
    nodes[n].id = id;
    first[static_cast<unsigned char>(s[0])] = true;
  }

  // The longest token that starts at `pos` and ends by `limit` (0: none).
  size_t Match(std::string_view text, size_t pos, size_t limit, int32_t* id) const {
    size_t best = 0;
    int32_t n = 0;
    for (size_t i = pos; i < limit; ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      const auto& next = nodes[n].next;
      auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
      if (it == next.end()) break;
      n = it->second;
      if (nodes[n].id >= 0) {
        best = i + 1 - pos;
        *id = nodes[n].id;
      }
    }
    return best;
  }

  // Calls gap(piece) for the text between tokens and token(match, id) for each token, in order.
  // A token may span at most room(p) bytes from p.
  template <typename Gap, typename Token, typename Room>
  absl::Status Split(std::string_view text, Gap&& gap, Token&& token, Room&& room) const {
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      int32_t id = -1;
      size_t len = 0;
      if (first[static_cast<unsigned char>(text[i])]) {
        len = Match(text, i, i + std::min(text.size() - i, room(text.data() + i)), &id);
      }
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > start) RETURN_IF_ERROR(gap(text.substr(start, i - start)));
      token(text.substr(i, len), id);
      i += len;
      start = i;
    }
    if (start < text.size()) RETURN_IF_ERROR(gap(text.substr(start)));
    return absl::OkStatus();
  }
};

struct Tokenizer::BpeScratch {
  std::vector<int32_t> id, prev, next;
  std::vector<uint64_t> heap;  // rank << 32 | left position, smallest first
};

namespace {

// Runs split steps [k, end) over `piece` and calls sink(piece) for each final piece.
template <typename Sink>
absl::Status SplitPieces(const std::vector<std::unique_ptr<Tokenizer::SplitStep>>& steps, size_t k,
                         std::string_view piece, pcre2_match_data* md, Sink& sink) {
  if (piece.empty()) return absl::OkStatus();
  if (k == steps.size()) {
    sink(piece);
    return absl::OkStatus();
  }
  const Tokenizer::SplitStep& step = *steps[k];
  auto emit = [&](size_t b, size_t e, bool is_match) -> absl::Status {
    const bool keep =
        step.behavior == Tokenizer::SplitStep::Behavior::kIsolated || is_match == step.invert;
    if (!keep || b == e) return absl::OkStatus();
    return SplitPieces(steps, k + 1, piece.substr(b, e - b), md, sink);
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t pos = 0, gap = 0;
  while (pos < piece.size()) {
    const int rc =
        pcre2_match(step.code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return absl::ResourceExhaustedError(
          absl::StrCat("tokenizer: pre-tokenizer regex '", step.pattern, "' failed on a ",
                       piece.size(), "-byte piece: ", reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t ms = ov[0], me = ov[1];
    if (ms < pos || me < ms || me > piece.size()) {
      return absl::InternalError(absl::StrCat("tokenizer: regex '", step.pattern,
                                              "' reported a match outside the subject (\\K?)"));
    }
    if (me == ms) {  // an empty match is no split; retry one character further
      pos = ms + 1;
      while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    RETURN_IF_ERROR(emit(gap, ms, false));
    RETURN_IF_ERROR(emit(ms, me, true));
    gap = pos = me;
  }
  return emit(gap, piece.size(), false);
}

// The normalizer must be none or an empty Sequence (added tokens and regexes then see the raw
// text); the decoder none or ByteLevel.
absl::Status CheckNormalizerAndDecoder(const json& j, const std::string& label) {
  if (auto n = j.find("normalizer"); n != j.end() && !n->is_null()) {
    const auto t = n->find("type");
    const auto list = n->find("normalizers");
    if (!n->is_object() || t == n->end() || *t != "Sequence" || list == n->end() ||
        !list->is_array() || !list->empty()) {
      return Bad(label, absl::StrCat("normalizer ", n->dump().substr(0, 200),
                                     " is not supported (only none or an empty Sequence)"));
    }
  }
  if (auto d = j.find("decoder"); d != j.end() && !d->is_null()) {
    if (!d->is_object() || d->value("type", json()) != "ByteLevel") {
      return Bad(label, absl::StrCat("decoder ", d->dump().substr(0, 200),
                                     " is not supported (only ByteLevel)"));
    }
  }

  return absl::OkStatus();
}

// The pre-tokenizer's Split steps, compiled; the last step must be ByteLevel.
absl::StatusOr<std::vector<std::unique_ptr<Tokenizer::SplitStep>>> ParsePreTokenizer(
    const json& j, const std::string& label) {
  std::vector<std::unique_ptr<Tokenizer::SplitStep>> splits;
  auto pt = j.find("pre_tokenizer");
  if (pt == j.end() || !pt->is_object()) {
    return Bad(label, "'pre_tokenizer' is missing or not an object (ByteLevel is required)");
  }
  std::vector<const json*> steps;
  if (pt->value("type", json()) == "Sequence") {
    auto list = pt->find("pretokenizers");
    if (list == pt->end() || !list->is_array()) {
      return Bad(label, "pre_tokenizer Sequence: 'pretokenizers' is not an array");
    }
    for (const json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(&*pt);
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = *steps[i];
    const std::string what = absl::StrCat("pre_tokenizer step ", i);
    if (!s.is_object()) return Bad(label, absl::StrCat(what, " is not an object"));
    ASSIGN_OR_RETURN(const std::string type, GetString(s, "type", label, what));
    if (type == "ByteLevel") {
      if (i + 1 != steps.size()) return Bad(label, absl::StrCat(what, ": ByteLevel must be last"));
      // Both default to true in `tokenizers`, so they must be written out as false.
      for (const char* key : {"add_prefix_space", "use_regex"}) {
        if (!s.contains(key)) {
          return Bad(label, absl::StrCat(what, ": ByteLevel '", key, "' must be given (false)"));
        }
        RETURN_IF_ERROR(ExpectFlag(s, key, false, label, what));
      }
      continue;
    }
    if (type != "Split") {
      return Bad(label, absl::StrCat(what, ": type '", type,
                                     "' is not supported (only Split and ByteLevel)"));
    }
    if (i + 1 == steps.size()) return Bad(label, "pre_tokenizer: the last step is not ByteLevel");
    auto step = std::make_unique<Tokenizer::SplitStep>();
    ASSIGN_OR_RETURN(const std::string behavior, GetString(s, "behavior", label, what));
    if (behavior == "Isolated") {
      step->behavior = Tokenizer::SplitStep::Behavior::kIsolated;
    } else if (behavior == "Removed") {
      step->behavior = Tokenizer::SplitStep::Behavior::kRemoved;
    } else {
      return Bad(label, absl::StrCat(what, ": Split behavior '", behavior,
                                     "' is not supported (only Isolated and Removed)"));
    }
    if (auto inv = s.find("invert"); inv != s.end() && !inv->is_null()) {
      if (!inv->is_boolean()) return Bad(label, absl::StrCat(what, ": 'invert' is not a boolean"));
      step->invert = inv->get<bool>();
    }
    auto pat = s.find("pattern");
    uint32_t options = PCRE2_UTF | PCRE2_UCP;
    if (pat != s.end() && pat->is_object() && pat->contains("Regex") &&
        (*pat)["Regex"].is_string()) {
      step->pattern = (*pat)["Regex"].get<std::string>();
    } else if (pat != s.end() && pat->is_object() && pat->contains("String") &&
               (*pat)["String"].is_string()) {
      step->pattern = (*pat)["String"].get<std::string>();
      options = PCRE2_UTF | PCRE2_LITERAL;  // UCP is not allowed (nor needed) with LITERAL
    } else {
      return Bad(label,
                 absl::StrCat(what, ": 'pattern' is not {\"Regex\": str} or {\"String\": str}"));
    }
    int err = 0;
    PCRE2_SIZE err_off = 0;
    step->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(step->pattern.data()),
                               step->pattern.size(), options, &err, &err_off, nullptr);
    if (step->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return Bad(label, absl::StrCat(what, ": regex '", step->pattern, "' at offset ", err_off,
                                     ": ", reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(step->code, PCRE2_JIT_COMPLETE);  // failure leaves the interpreter
    splits.push_back(std::move(step));
  }
  if (steps.empty() || steps.back()->value("type", json()) != "ByteLevel") {
    return Bad(label, "pre_tokenizer: the last step is not ByteLevel");
  }
  return splits;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view text,
                                                               const std::string& label) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  RETURN_IF_ERROR(t->Parse(text, label));
  return t;
}

absl::Status Tokenizer::Parse(std::string_view text, const std::string& label) {
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(label, "not well-formed JSON");
  if (!j.is_object()) return Bad(label, "top level is not a JSON object");

  RETURN_IF_ERROR(CheckNormalizerAndDecoder(j, label));

  // Byte alphabet.
  const std::array<uint32_t, 256> alphabet = ByteAlphabet();
  std::array<int, 324> char_to_byte;
  char_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) {
    char_to_byte[alphabet[b]] = b;
    byte_to_char_[b].clear();
    utf8::Append(alphabet[b], &byte_to_char_[b]);
  }

  // Model.
  auto m = j.find("model");
  if (m == j.end() || !m->is_object()) return Bad(label, "'model' is missing or not an object");
  if (auto t = m->find("type"); t != m->end() && *t != "BPE") {
    return Bad(label, absl::StrCat("model type ", t->dump(), " is not supported (only BPE)"));
  }
  RETURN_IF_ERROR(ExpectUnset(*m, "dropout", label, "model"));
  RETURN_IF_ERROR(ExpectUnset(*m, "unk_token", label, "model"));
  RETURN_IF_ERROR(ExpectUnset(*m, "continuing_subword_prefix", label, "model"));
  RETURN_IF_ERROR(ExpectUnset(*m, "end_of_word_suffix", label, "model"));
  RETURN_IF_ERROR(ExpectFlag(*m, "byte_fallback", false, label, "model"));
  if (auto im = m->find("ignore_merges"); im != m->end() && !im->is_null()) {
    if (!im->is_boolean()) return Bad(label, "model: 'ignore_merges' is not a boolean");
    ignore_merges_ = im->get<bool>();
  }

  auto vocab = m->find("vocab");
  if (vocab == m->end() || !vocab->is_object()) {
    return Bad(label, "model: 'vocab' is missing or not an object");
  }
  auto set_id = [&](int32_t id, std::string bytes, std::string_view token) -> absl::Status {
    if (static_cast<size_t>(id) >= id_bytes_.size()) {
      id_bytes_.resize(id + 1);
      has_token_.resize(id + 1);
      is_added_.resize(id + 1);
    }
    if (has_token_[id]) {
      return Bad(label, absl::StrCat("token '", AV(token), "': id ", id, " is already used"));
    }
    has_token_[id] = true;
    id_bytes_[id] = std::move(bytes);
    return absl::OkStatus();
  };
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= kMaxId) {
      return Bad(label, absl::StrCat("vocab '", it.key(), "': id ", it->dump(),
                                     " is not an integer in [0, ", kMaxId, ")"));
    }
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    RETURN_IF_ERROR(set_id(id, TokenToBytes(it.key(), char_to_byte), it.key()));
    vocab_.emplace(it.key(), id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_to_char_[b]);
    if (it == vocab_.end()) {
      return Bad(label, absl::StrCat("vocab has no token for byte ", b, " ('", byte_to_char_[b],
                                     "'): not a byte-level BPE"));
    }
    byte_id_[b] = it->second;
  }

  auto merges = m->find("merges");
  if (merges == m->end() || !merges->is_array()) {
    return Bad(label, "model: 'merges' is missing or not an array");
  }
  merges_.reserve(merges->size());
  if (merges->size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Bad(label, "too many merges");
  }
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& e = (*merges)[rank];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Bad(label, absl::StrCat("merge ", rank, " ", e.dump(), " is not \"a b\""));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return Bad(label, absl::StrCat("merge ", rank, " ", e.dump().substr(0, 100),
                                     " is neither \"a b\" nor [\"a\", \"b\"]"));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ic == vocab_.end()) {
      return Bad(label, absl::StrCat("merge ", rank, " ", e.dump(), ": '",
                                     ia == vocab_.end()   ? a
                                     : ib == vocab_.end() ? b
                                                          : a + b,
                                     "' is not in the vocab"));
    }
    // A repeated pair keeps its last rank, as `tokenizers` does.
    merges_[(uint64_t(ia->second) << 32) | uint32_t(ib->second)] =
        (uint64_t(rank) << 32) | uint32_t(ic->second);
  }

  // Added tokens.
  if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    if (!at->is_array()) return Bad(label, "'added_tokens' is not an array");
    for (size_t i = 0; i < at->size(); ++i) {
      const json& e = (*at)[i];
      const std::string what = absl::StrCat("added_tokens[", i, "]");
      if (!e.is_object()) return Bad(label, absl::StrCat(what, " is not an object"));
      ASSIGN_OR_RETURN(const std::string content, GetString(e, "content", label, what));
      if (content.empty()) return Bad(label, absl::StrCat(what, ": empty content"));
      auto idv = e.find("id");
      if (idv == e.end()) return Bad(label, absl::StrCat(what, ": 'id' is missing"));
      ASSIGN_OR_RETURN(const int32_t id, GetId(*idv, label, what));
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        RETURN_IF_ERROR(ExpectFlag(e, flag, false, label, what));
      }
      bool normalized = false;
      if (auto nv = e.find("normalized"); nv != e.end() && nv->is_boolean()) {
        normalized = nv->get<bool>();
      }
      if (added_.contains(content)) {
        return Bad(label, absl::StrCat(what, " '", content, "' appears twice"));
      }
      // Tokens 0-2 are in the vocab too: same id is fine, anything else is a clash.
      if (auto v = vocab_.find(content); v != vocab_.end() && v->second == id) {
        is_added_[id] = true;
        id_bytes_[id] = content;
      } else {
        RETURN_IF_ERROR(set_id(id, content, content));
        is_added_[id] = true;
      }
      added_.emplace(content, std::make_pair(id, normalized));
    }
  }

  ASSIGN_OR_RETURN(splits_, ParsePreTokenizer(j, label));
  RebuildTries();
  return absl::OkStatus();
}

void Tokenizer::RebuildTries() {
  auto raw = std::make_unique<Trie>(), norm = std::make_unique<Trie>();
  for (const auto& [content, v] : added_) (v.second ? norm : raw)->Insert(content, v.first);
  raw_trie_ = std::move(raw);
  normalized_trie_ = std::move(norm);
}

absl::Status Tokenizer::AddSpecialTokens(std::span<const AddedToken> tokens) {
  // Validate everything first so a failure changes nothing.
  absl::flat_hash_map<std::string, int32_t> seen;
  absl::flat_hash_map<int32_t, std::string> seen_ids;
  std::vector<const AddedToken*> fresh;
  for (const AddedToken& t : tokens) {
    const std::string what = absl::StrCat("special token '", t.content, "' (id ", t.id, ")");
    if (t.content.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty"));
    if (t.id < 0 || t.id >= kMaxId) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": id out of range"));
    }
    if (auto a = added_.find(t.content); a != added_.end()) {
      if (a->second.first != t.id) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": already an added token with id ", a->second.first));
      }
      continue;
    }
    if (static_cast<size_t>(t.id) < has_token_.size() && has_token_[t.id]) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": id already used by '", id_bytes_[t.id], "'"));
    }
    auto [s, new_content] = seen.emplace(t.content, t.id);
    auto [si, new_id] = seen_ids.emplace(t.id, t.content);
    if (!new_content && s->second != t.id) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": given twice with different ids"));
    }
    if (!new_id && si->second != t.content) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": id given twice"));
    }
    if (new_content) fresh.push_back(&t);
  }
  for (const AddedToken* t : fresh) {
    if (static_cast<size_t>(t->id) >= id_bytes_.size()) {
      id_bytes_.resize(t->id + 1);
      has_token_.resize(t->id + 1);
      is_added_.resize(t->id + 1);
    }
    has_token_[t->id] = true;
    is_added_[t->id] = true;
    id_bytes_[t->id] = t->content;
    added_.emplace(t->content, std::make_pair(t->id, false));
  }
  RebuildTries();
  return absl::OkStatus();
}

template <typename Sink>
absl::Status Tokenizer::ForEachPiece(std::string_view text, PlainText plain, Sink&& sink) const {
  if (text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: text of ", text.size(), " bytes exceeds the 2 GiB limit"));
  }
  if (const size_t bad = utf8::FirstInvalid(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: input is not valid UTF-8 (byte offset ", bad, ")"));
  }
  for (size_t k = 0; k < plain.size(); ++k) {
    const auto [b, e] = plain[k];
    if (b > e || e > text.size() || (k > 0 && b < plain[k - 1].second)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: plain-text range ", k, " [", b, ", ", e,
                       ") is not sorted, disjoint and inside the ", text.size(), "-byte text"));
    }
  }
  // Bytes an added token starting at `p` may span: none inside a plain range, else up to the next.
  auto room = [&](const char* p) -> size_t {
    const size_t pos = static_cast<size_t>(p - text.data());
    auto it = std::upper_bound(plain.begin(), plain.end(), pos,
                               [](size_t x, const auto& r) { return x < r.second; });
    if (it == plain.end()) return text.size() - pos;
    return it->first <= pos ? 0 : it->first - pos;
  };
  MatchData md(pcre2_match_data_create(1, nullptr));
  if (!md) return absl::ResourceExhaustedError("tokenizer: cannot allocate PCRE2 match data");
  auto bpe_piece = [&](std::string_view piece) { sink(piece, -1); };
  auto added = [&](std::string_view match, int32_t id) { sink(match, id); };
  auto pre_split = [&](std::string_view gap) {
    return SplitPieces(splits_, 0, gap, md.get(), bpe_piece);
  };
  return raw_trie_->Split(
      text,
      [&](std::string_view gap) { return normalized_trie_->Split(gap, pre_split, added, room); },
      added, room);
}

void Tokenizer::Bpe(std::string_view piece, BpeScratch& s, std::vector<int32_t>* out) const {
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  const int32_t n = static_cast<int32_t>(piece.size());
  if (n == 1) {
    out->push_back(byte_id_[p[0]]);
    return;
  }
  if (ignore_merges_) {
    std::string word;
    for (int32_t i = 0; i < n; ++i) word += byte_to_char_[p[i]];
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  s.id.resize(n);
  s.prev.resize(n);
  s.next.resize(n);
  s.heap.clear();
  auto add = [&](int32_t l, int32_t r) {
    auto it = merges_.find((uint64_t(uint32_t(s.id[l])) << 32) | uint32_t(s.id[r]));
    if (it == merges_.end()) return false;
    s.heap.push_back((it->second & 0xFFFFFFFF00000000ull) | uint32_t(l));
    return true;
  };
  auto push = [&](int32_t l, int32_t r) {
    if (add(l, r)) std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i < n; ++i) {
    s.id[i] = byte_id_[p[i]];
    s.prev[i] = i - 1;
    s.next[i] = i + 1 < n ? i + 1 : -1;
  }
  for (int32_t i = 0; i + 1 < n; ++i) add(i, i + 1);
  std::make_heap(s.heap.begin(), s.heap.end(), std::greater<>());  // O(n), unlike n pushes
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    const uint64_t top = s.heap.back();
    s.heap.pop_back();
    const int32_t l = static_cast<int32_t>(top & 0xFFFFFFFFu);
    if (s.id[l] < 0) continue;  // merged into its left neighbour
    const int32_t r = s.next[l];
    if (r < 0) continue;
    auto it = merges_.find((uint64_t(uint32_t(s.id[l])) << 32) | uint32_t(s.id[r]));
    if (it == merges_.end() || (it->second >> 32) != (top >> 32)) continue;  // stale entry
    s.id[l] = static_cast<int32_t>(it->second & 0xFFFFFFFFu);
    s.id[r] = -1;
    s.next[l] = s.next[r];
    if (s.next[r] >= 0) s.prev[s.next[r]] = l;
    if (s.prev[l] >= 0) push(s.prev[l], l);
    if (s.next[l] >= 0) push(l, s.next[l]);
  }
  for (int32_t i = 0; i >= 0; i = s.next[i]) out->push_back(s.id[i]);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  return Encode(text, {});
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       PlainText plain_text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 1);
  BpeScratch scratch;
  // Pieces seen earlier in this call -> where their ids already are in `ids` (begin, count).
  absl::flat_hash_map<absl::string_view, std::pair<uint32_t, uint32_t>> seen;
  RETURN_IF_ERROR(ForEachPiece(text, plain_text, [&](std::string_view piece, int32_t added) {
    if (added >= 0) {
      ids.push_back(added);
      return;
    }
    if (piece.size() == 1) {
      ids.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (auto it = seen.find(AV(piece)); it != seen.end()) {
      const auto [begin, count] = it->second;
      // Room first (the copy reads from `ids` itself), grown geometrically: an exact-size
      // reserve per repeated piece would copy the whole vector each time.
      if (ids.size() + count > ids.capacity()) ids.reserve(2 * (ids.size() + count));
      for (uint32_t k = 0; k < count; ++k) ids.push_back(ids[begin + k]);
      return;
    }
    const size_t begin = ids.size();
    Bpe(piece, scratch, &ids);
    if (seen.size() < kMaxSeenPieces) {
      seen.emplace(AV(piece), std::make_pair(uint32_t(begin), uint32_t(ids.size() - begin)));
    }
  }));
  return ids;
}

absl::StatusOr<std::vector<std::string_view>> Tokenizer::PreTokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  RETURN_IF_ERROR(
      ForEachPiece(text, {}, [&](std::string_view piece, int32_t) { pieces.emplace_back(piece); }));
  return pieces;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<std::string_view> b = TokenBytes(ids[i]);
    if (!b) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: id ", ids[i], " at position ", i,
                                                     " is not a token (vocab size ", vocab_size(),
                                                     ")"));
    }
    bytes.append(*b);
  }
  return utf8::Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  if (auto a = added_.find(AV(token)); a != added_.end()) return a->second.first;
  if (auto v = vocab_.find(AV(token)); v != vocab_.end()) return v->second;
  return std::nullopt;
}

std::optional<std::string_view> Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !has_token_[id]) return std::nullopt;
  return id_bytes_[id];
}

bool Tokenizer::IsAddedToken(int32_t id) const {
  return id >= 0 && id < vocab_size() && is_added_[id];
}

absl::StatusOr<std::string> StreamDecoder::Add(int32_t id) {
  std::optional<std::string_view> b = tokenizer_->TokenBytes(id);
  if (!b) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: id ", id, " is not a token (vocab size ", tokenizer_->vocab_size(), ")"));
  }
  pending_.append(*b);
  const size_t n = utf8::CompletePrefix(pending_);
  std::string out = utf8::Lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out = utf8::Lossy(pending_);
  pending_.clear();
  return out;
}

absl::StatusOr<std::vector<AddedToken>> ReadAddedTokensFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(path, "not well-formed JSON");
  std::vector<AddedToken> out;
  auto take = [&](const json& list, const std::string& where, bool v4_only) -> absl::Status {
    if (!list.is_array()) return Bad(path, absl::StrCat(where, " is not an array"));
    for (size_t i = 0; i < list.size(); ++i) {
      const json& e = list[i];
      const std::string what = absl::StrCat(where, "[", i, "]");
      if (!e.is_object()) return Bad(path, absl::StrCat(what, " is not an object"));
      if (v4_only && e.value("status", json()) != "v4") continue;
      ASSIGN_OR_RETURN(std::string content, GetString(e, "content", path, what));
      auto id = e.find("id");
      if (id == e.end()) return Bad(path, absl::StrCat(what, ": 'id' is missing"));
      ASSIGN_OR_RETURN(const int32_t v, GetId(*id, path, what));
      out.push_back({std::move(content), v});
    }
    return absl::OkStatus();
  };
  if (j.is_array()) {
    RETURN_IF_ERROR(take(j, "top level", false));
  } else if (j.is_object() && j.contains("added")) {
    if (auto v3 = j.find("already_in_v3"); v3 != j.end()) {
      RETURN_IF_ERROR(take(*v3, "already_in_v3", false));
    }
    RETURN_IF_ERROR(take(*j.find("added"), "added", true));
  } else {
    return Bad(path, "neither an array of {content, id} nor a table with 'added'");
  }
  return out;
}

}  // namespace ss
