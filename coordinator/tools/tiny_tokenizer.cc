#include "coordinator/tools/tiny_tokenizer.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/dsv4_format.h"
#include "nlohmann/json.hpp"

namespace ss::tools {
namespace {

using Json = nlohmann::ordered_json;

// normalizer, pre_tokenizer, post_processor and decoder of DeepSeek's tokenizer.json, verbatim.
constexpr std::string_view kDeepSeekSections = R"json({
 "normalizer": {
  "type": "Sequence",
  "normalizers": []
 },
 "pre_tokenizer": {
  "type": "Sequence",
  "pretokenizers": [
   {
    "type": "Split",
    "pattern": {
     "Regex": "\\p{N}{1,3}"
    },
    "behavior": "Isolated",
    "invert": false
   },
   {
    "type": "Split",
    "pattern": {
     "Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
    },
    "behavior": "Isolated",
    "invert": false
   },
   {
    "type": "Split",
    "pattern": {
     "Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
    },
    "behavior": "Isolated",
    "invert": false
   },
   {
    "type": "ByteLevel",
    "add_prefix_space": false,
    "trim_offsets": true,
    "use_regex": false
   }
  ]
 },
 "post_processor": {
  "type": "ByteLevel",
  "add_prefix_space": true,
  "trim_offsets": false,
  "use_regex": true
 },
 "decoder": {
  "type": "ByteLevel",
  "add_prefix_space": true,
  "trim_offsets": true,
  "use_regex": true
 }
})json";

constexpr std::string_view kLowSpecials[] = {chat::kBosToken, chat::kEosToken, "<｜▁pad▁｜>"};
constexpr std::string_view kHighSpecials[] = {
    chat::kUserToken,   chat::kAssistantToken, chat::kThinkingStart,
    chat::kThinkingEnd, chat::kDsmlToken,      chat::kLatestReminderToken,
    "<｜action｜>",     "<｜query｜>",         "<｜authority｜>",
    "<｜domain｜>",     "<｜title｜>",         "<｜read_url｜>"};
constexpr int32_t kNumLow = 3;
constexpr int32_t kNumHigh = static_cast<int32_t>(std::size(kHighSpecials));
constexpr int32_t kFirstByteId = kNumLow;
constexpr int32_t kFirstMergeId = kFirstByteId + 256;

// GPT-2's byte -> printable character table, UTF-8 encoded, and the bytes in DeepSeek's vocab
// order (printable ranges first, then the rest).
struct ByteAlphabet {
  std::string chars[256];
  int order[256];
  ByteAlphabet() {
    int n = 0;
    bool printable[256] = {};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int extra = 0;
    uint32_t cp[256];
    for (int b = 0; b < 256; ++b) cp[b] = printable[b] ? b : 256 + extra++;
    for (int b = 0; b < 256; ++b) {
      if (printable[b]) order[n++] = b;
    }
    for (int b = 0; b < 256; ++b) {
      if (!printable[b]) order[n++] = b;
    }
    for (int b = 0; b < 256; ++b) {
      chars[b] = cp[b] < 0x80 ? std::string(1, static_cast<char>(cp[b]))
                              : std::string{static_cast<char>(0xC0 | (cp[b] >> 6)),
                                            static_cast<char>(0x80 | (cp[b] & 0x3F))};
    }
  }
};

Json AddedTokenJson(const AddedToken& t) {
  Json j = Json::object();
  j["id"] = t.id;
  j["content"] = t.content;
  j["single_word"] = false;
  j["lstrip"] = false;
  j["rstrip"] = false;
  j["normalized"] = false;
  j["special"] = true;
  return j;
}

Json TokenizerJson(const std::vector<AddedToken>& specials, const Json& vocab, const Json& merges) {
  const Json sections = Json::parse(kDeepSeekSections);
  Json j = Json::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  Json added = Json::array();
  for (const auto& t : specials) added.push_back(AddedTokenJson(t));
  j["added_tokens"] = std::move(added);
  for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    j[key] = sections.at(key);
  }
  Json model = Json::object();
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["vocab"] = vocab;
  model["merges"] = merges;
  j["model"] = std::move(model);
  return j;
}

struct Word {
  std::vector<int32_t> syms;
  int64_t count = 0;
};

}  // namespace

std::vector<AddedToken> TinySpecialTokens(int32_t vocab_size) {
  std::vector<AddedToken> out;
  for (int32_t i = 0; i < kNumLow; ++i) out.push_back({std::string(kLowSpecials[i]), i});
  for (int32_t i = 0; i < kNumHigh; ++i) {
    out.push_back({std::string(kHighSpecials[i]), vocab_size - kNumHigh + i});
  }
  return out;
}

absl::StatusOr<std::string> MakeTinyTokenizerJson(std::string_view corpus, int32_t vocab_size) {
  if (vocab_size < kFirstMergeId + kNumHigh) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", vocab_size, " < ", kFirstMergeId + kNumHigh));
  }
  const std::vector<AddedToken> specials = TinySpecialTokens(vocab_size);
  static const ByteAlphabet alphabet;
  std::vector<std::string> token(kFirstMergeId);  // id -> byte-alphabet string
  int32_t byte_id[256];
  for (int32_t i = 0; i < kNumLow; ++i) token[i] = specials[i].content;
  for (int32_t i = 0; i < 256; ++i) {
    const int b = alphabet.order[i];
    byte_id[b] = kFirstByteId + i;
    token[kFirstByteId + i] = alphabet.chars[b];
  }
  absl::flat_hash_map<std::string, int32_t> id_of;
  for (int32_t i = 0; i < kFirstMergeId; ++i) id_of[token[i]] = i;

  // Cut the corpus with the pre-tokenizer of a bytes-only tokenizer of the same format.
  Json vocab = Json::object();
  for (int32_t i = 0; i < kFirstMergeId; ++i) vocab[token[i]] = i;
  const std::string bootstrap = TokenizerJson(specials, vocab, Json::array()).dump();
  ASSIGN_OR_RETURN(auto splitter, Tokenizer::FromJson(bootstrap, "tiny tokenizer bootstrap"));
  ASSIGN_OR_RETURN(const auto pieces, splitter->PreTokenize(corpus));
  absl::flat_hash_set<std::string_view> special_text;
  for (const auto& t : specials) special_text.insert(t.content);
  std::map<std::string_view, int64_t> counts;  // sorted: the word order is deterministic
  for (std::string_view p : pieces) {
    if (!special_text.contains(p)) ++counts[p];
  }
  std::vector<Word> words;
  for (const auto& [piece, count] : counts) {
    Word w;
    w.count = count;
    for (unsigned char c : piece) w.syms.push_back(byte_id[c]);
    if (w.syms.size() > 1) words.push_back(std::move(w));
  }

  Json merges = Json::array();
  const int32_t end = vocab_size - kNumHigh;
  int32_t next = kFirstMergeId;
  while (next < end) {
    absl::flat_hash_map<uint64_t, int64_t> pairs;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
        pairs[(uint64_t(uint32_t(w.syms[i])) << 32) | uint32_t(w.syms[i + 1])] += w.count;
      }
    }
    if (pairs.empty()) break;
    uint64_t best = 0;
    int64_t best_count = -1;
    for (const auto& [key, count] : pairs) {
      const auto better = [&] {
        if (count != best_count) return count > best_count;
        const int32_t a = int32_t(key >> 32), b = int32_t(key & 0xffffffffu);
        const int32_t ba = int32_t(best >> 32), bb = int32_t(best & 0xffffffffu);
        return std::tie(token[a], token[b]) < std::tie(token[ba], token[bb]);
      };
      if (better()) {
        best = key;
        best_count = count;
      }
    }
    const int32_t a = int32_t(best >> 32), b = int32_t(best & 0xffffffffu);
    const std::string merged = token[a] + token[b];
    int32_t id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      id = it->second;  // the same string from another pair: a second merge rule, no new id
    } else {
      id = next++;
      token.push_back(merged);
      id_of[merged] = id;
      vocab[merged] = id;
    }
    merges.push_back(absl::StrCat(token[a], " ", token[b]));
    for (Word& w : words) {
      size_t out = 0;
      for (size_t i = 0; i < w.syms.size(); ++i) {
        if (i + 1 < w.syms.size() && w.syms[i] == a && w.syms[i + 1] == b) {
          w.syms[out++] = id;
          ++i;
        } else {
          w.syms[out++] = w.syms[i];
        }
      }
      w.syms.resize(out);
    }
  }
  return TokenizerJson(specials, vocab, merges).dump(2) + "\n";
}

}  // namespace ss::tools
