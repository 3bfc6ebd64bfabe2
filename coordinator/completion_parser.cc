#include "coordinator/completion_parser.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "coordinator/py_json.h"
#include "nlohmann/json.hpp"

namespace ss::chat {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest proper suffix of `text` that is a prefix of one of `markers`.
size_t PartialMarkerLength(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view marker : markers) {
    const size_t max_len = std::min(text.size(), marker.size() - 1);
    for (size_t len = max_len; len > best; --len) {
      if (marker.substr(0, len) == text.substr(text.size() - len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

// Number of trailing bytes of `text` that start a UTF-8 sequence not complete yet.
size_t IncompleteUtf8Tail(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(n, 4); ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    }
    return need > back ? back : 0;
  }
  return 0;
}

enum class Parse { kOk, kNeedMore, kInvalid };

// Recursive-descent reader of one tool-call block over a buffer that may still grow. Every
// decision depends only on the text read so far: kInvalid is returned only when no continuation
// could make the block well-formed, kNeedMore when the text ends before the block does (or, when
// `final_`, kInvalid instead). That makes the outcome independent of how the text was split.
class ToolBlockReader {
 public:
  ToolBlockReader(std::string_view text, bool final) : s_(text), final_(final) {}

  Parse Read(std::vector<ParsedToolCall>* calls, size_t* end) {
    Parse p = Expect(kToolCallsStart);
    if (p == Parse::kOk) p = Expect(">");
    if (p == Parse::kOk) p = SkipSpace();
    while (p == Parse::kOk) {
      int which = -1;
      p = ExpectOneOf({kInvokeOpen, kToolCallsClose}, &which);
      if (p != Parse::kOk) break;
      if (which == 1) {
        // The closing tag of the block ends with '>' already.
        *end = pos_;
        return Parse::kOk;
      }
      ParsedToolCall call;
      p = ReadInvoke(&call);
      if (p == Parse::kOk) calls->push_back(std::move(call));
    }
    return p;
  }

 private:
  Parse NeedMore() const { return final_ ? Parse::kInvalid : Parse::kNeedMore; }

  Parse Expect(std::string_view lit) {
    const std::string_view rest = s_.substr(pos_);
    if (rest.size() >= lit.size()) {
      if (rest.substr(0, lit.size()) != lit) return Parse::kInvalid;
      pos_ += lit.size();
      return Parse::kOk;
    }
    return lit.substr(0, rest.size()) == rest ? NeedMore() : Parse::kInvalid;
  }

  Parse ExpectOneOf(std::initializer_list<std::string_view> lits, int* which) {
    const std::string_view rest = s_.substr(pos_);
    bool viable = false;
    int i = 0;
    for (std::string_view lit : lits) {
      if (rest.substr(0, lit.size()) == lit) {
        pos_ += lit.size();
        *which = i;
        return Parse::kOk;
      }
      if (rest.size() < lit.size() && lit.substr(0, rest.size()) == rest) viable = true;
      ++i;
    }
    return viable ? NeedMore() : Parse::kInvalid;
  }

  Parse SkipSpace() {
    while (pos_ < s_.size() && IsSpace(s_[pos_])) ++pos_;
    return pos_ < s_.size() ? Parse::kOk : NeedMore();
  }

  // The earliest of `stops` at or after pos_: sets *at to its offset and *which to its index.
  Parse Find(std::initializer_list<std::string_view> stops, size_t* at, int* which) {
    size_t best = std::string_view::npos;
    int i = 0;
    for (std::string_view stop : stops) {
      const size_t found = s_.find(stop, pos_);
      if (found < best) {
        best = found;
        *which = i;
      }
      ++i;
    }
    if (best == std::string_view::npos) return NeedMore();
    *at = best;
    return Parse::kOk;
  }

  // After "<｜DSML｜invoke": ` name="NAME">` WS, parameters, "</｜DSML｜invoke>" WS.
  Parse ReadInvoke(ParsedToolCall* call) {
    Parse p = SkipSpace();
    if (p == Parse::kOk) p = Expect("name=\"");
    size_t at = 0;
    int which = -1;
    if (p == Parse::kOk) p = Find({kParameterOpen, kInvokeClose}, &at, &which);
    if (p != Parse::kOk) return p;
    std::string_view header = s_.substr(pos_, at - pos_);
    while (!header.empty() && IsSpace(header.back())) header.remove_suffix(1);
    if (header.size() < 2 || header.substr(header.size() - 2) != "\">") return Parse::kInvalid;
    call->name = std::string(header.substr(0, header.size() - 2));
    if (call->name.find(kDsmlToken) != std::string::npos) return Parse::kInvalid;

    std::vector<std::pair<std::string, std::string>> params;  // name -> JSON value text
    pos_ = at;
    p = ExpectOneOf({kParameterOpen, kInvokeClose}, &which);
    while (p == Parse::kOk && which == 0) {
      p = ReadParameter(&params);
      if (p == Parse::kOk) p = ExpectOneOf({kParameterOpen, kInvokeClose}, &which);
    }
    if (p == Parse::kOk) p = Expect(">");
    if (p == Parse::kOk) p = SkipSpace();
    if (p != Parse::kOk) return p;

    std::string args = "{";
    for (size_t i = 0; i < params.size(); ++i) {
      if (i > 0) args += ", ";
      AppendPyJsonString(params[i].first, &args);
      args += ": ";
      args += params[i].second;
    }
    args += '}';
    call->arguments = std::move(args);
    return Parse::kOk;
  }

  // After "<｜DSML｜parameter": ` name="K" string="true|false">V</｜DSML｜parameter>` WS.
  Parse ReadParameter(std::vector<std::pair<std::string, std::string>>* params) {
    Parse p = Expect(" name=\"");
    size_t at = 0;
    int which = -1;
    if (p == Parse::kOk) p = Find({kParameterClose}, &at, &which);
    if (p != Parse::kOk) return p;
    const std::string_view body = s_.substr(pos_, at - pos_);  // K" string="…">V
    // The name ends at the first `" string="true">` or `" string="false">` (a non-greedy match).
    constexpr std::string_view kString = "\" string=\"";
    size_t name_end = std::string_view::npos;
    bool is_str = false;
    size_t value_begin = 0;
    for (size_t q = body.find(kString); q != std::string_view::npos;
         q = body.find(kString, q + 1)) {
      const std::string_view after = body.substr(q + kString.size());
      if (after.substr(0, 6) == "true\">") {
        name_end = q;
        is_str = true;
        value_begin = q + kString.size() + 6;
        break;
      }
      if (after.substr(0, 7) == "false\">") {
        name_end = q;
        value_begin = q + kString.size() + 7;
        break;
      }
    }
    if (name_end == std::string_view::npos) return Parse::kInvalid;
    std::string name(body.substr(0, name_end));
    for (const auto& param : *params) {
      if (param.first == name) return Parse::kInvalid;
    }
    const std::string_view value = body.substr(value_begin);
    // DSML inside a name or value is markup gone wrong (e.g. an unclosed parameter swallowing the
    // next block), not data.
    if (body.substr(0, name_end).find(kDsmlToken) != std::string_view::npos ||
        value.find(kDsmlToken) != std::string_view::npos) {
      return Parse::kInvalid;
    }
    std::string json;
    if (is_str || !nlohmann::json::accept(value)) {
      AppendPyJsonString(value, &json);
    } else {
      json = std::string(value);
    }
    params->emplace_back(std::move(name), std::move(json));
    pos_ = at + kParameterClose.size();
    p = Expect(">");
    if (p == Parse::kOk) p = SkipSpace();
    return p;
  }

  std::string_view s_;
  bool final_;
  size_t pos_ = 0;
};

}  // namespace

CompletionStreamParser::CompletionStreamParser(ThinkingMode mode, bool tool_calls)
    : phase_(mode == ThinkingMode::kThinking ? Phase::kReasoning : Phase::kContent),
      tool_calls_(tool_calls) {}

std::string* CompletionStreamParser::Channel(Phase phase, CompletionDelta* out) const {
  return phase == Phase::kReasoning ? &out->reasoning_content : &out->content;
}

CompletionDelta CompletionStreamParser::Feed(std::string_view text) {
  CompletionDelta out;
  if (phase_ == Phase::kDone) return out;
  buffer_.append(text);
  Process(/*final=*/false, &out);
  return out;
}

CompletionDelta CompletionStreamParser::Finish() {
  CompletionDelta out;
  if (phase_ == Phase::kDone) return out;
  Process(/*final=*/true, &out);
  return out;
}

void CompletionStreamParser::Process(bool final, CompletionDelta* out) {
  // EOS ends the message; nothing after it counts.
  if (const size_t eos = buffer_.find(kEosToken); eos != std::string::npos) {
    buffer_.resize(eos);
    final = true;
  }
  while (true) {
    if (phase_ == Phase::kToolBlock) {
      std::vector<ParsedToolCall> calls;
      size_t end = 0;
      const Parse p = ToolBlockReader(buffer_, final).Read(&calls, &end);
      if (p == Parse::kNeedMore) return;
      if (p == Parse::kOk) {
        for (ParsedToolCall& call : calls) out->tool_calls.push_back(std::move(call));
        buffer_.erase(0, end);
        phase_ = Phase::kContent;
      } else {
        // Not a block: its opening marker is plain text; read on after it.
        Channel(block_return_, out)->append(kToolCallsStart);
        buffer_.erase(0, kToolCallsStart.size());
        phase_ = block_return_;
      }
      continue;
    }
    if (phase_ == Phase::kDone) return;

    const bool reasoning = phase_ == Phase::kReasoning;
    const size_t think_end = reasoning ? buffer_.find(kThinkingEnd) : std::string::npos;
    const size_t block = tool_calls_ ? buffer_.find(kToolCallsStart) : std::string::npos;
    std::string* channel = Channel(phase_, out);
    if (think_end != std::string::npos && think_end < block) {
      channel->append(buffer_, 0, think_end);
      buffer_.erase(0, think_end + kThinkingEnd.size());
      phase_ = Phase::kContent;
      continue;
    }
    if (block != std::string::npos) {
      channel->append(buffer_, 0, block);
      buffer_.erase(0, block);
      block_return_ = phase_;
      phase_ = Phase::kToolBlock;
      continue;
    }
    if (final) {
      channel->append(buffer_);
      buffer_.clear();
      phase_ = Phase::kDone;
      return;
    }
    const std::string_view block_marker = tool_calls_ ? kToolCallsStart : kEosToken;
    size_t hold = reasoning ? PartialMarkerLength(buffer_, {kThinkingEnd, block_marker, kEosToken})
                            : PartialMarkerLength(buffer_, {block_marker, kEosToken});
    hold += IncompleteUtf8Tail(std::string_view(buffer_).substr(0, buffer_.size() - hold));
    channel->append(buffer_, 0, buffer_.size() - hold);
    buffer_.erase(0, buffer_.size() - hold);
    return;
  }
}

ParsedCompletion ParseCompletion(std::string_view text, ThinkingMode mode, bool tool_calls) {
  CompletionStreamParser parser(mode, tool_calls);
  ParsedCompletion result;
  auto absorb = [&](CompletionDelta d) {
    result.reasoning_content += d.reasoning_content;
    result.content += d.content;
    for (ParsedToolCall& call : d.tool_calls) result.tool_calls.push_back(std::move(call));
  };
  absorb(parser.Feed(text));
  absorb(parser.Finish());
  return result;
}

}  // namespace ss::chat
