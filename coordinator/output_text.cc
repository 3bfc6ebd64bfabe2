#include "coordinator/output_text.h"

#include <algorithm>
#include <utility>

namespace ss {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStringMatcher::Feed(std::string_view text) {
  if (stopped_) return {};
  buffer_.append(text);
  if (stops_.empty()) return std::exchange(buffer_, {});
  // The match that ends first; of those, the one that starts first.
  size_t best_end = std::string::npos, best_start = 0;
  for (const auto& s : stops_) {
    const size_t pos = buffer_.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best_start)) {
      best_end = end;
      best_start = pos;
    }
  }
  if (best_end != std::string::npos) {
    stopped_ = true;
    matched_ = buffer_.substr(best_start, best_end - best_start);
    std::string out = buffer_.substr(0, include_stop_ ? best_end : best_start);
    buffer_.clear();
    return out;
  }
  // Hold back the longest suffix that some stop string starts with.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, buffer_.size()); k > hold; --k) {
      if (std::string_view(buffer_).substr(buffer_.size() - k) ==
          std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  std::string out = buffer_.substr(0, buffer_.size() - hold);
  buffer_.erase(0, buffer_.size() - hold);
  return out;
}

std::string StopStringMatcher::Finish() {
  if (stopped_) return {};
  return std::exchange(buffer_, {});
}

void OutputText::Piece::Append(Piece other) {
  text += other.text;
  for (auto& e : other.logprobs) logprobs.push_back(std::move(e));
}

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                       bool include_stop, size_t min_tokens)
    : decoder_(tokenizer),
      matcher_(std::move(stop_strings), include_stop),
      min_tokens_(min_tokens) {}

void OutputText::Release(Piece* out) {
  if (stopped()) {
    // Ids that put at least one byte into the returned text; the others made the stop string.
    for (auto& p : pending_) {
      if (p.entry.text_offset < returned_) out->logprobs.push_back(std::move(p.entry));
    }
    pending_.clear();
    return;
  }
  size_t n = 0;
  while (n < pending_.size() && pending_[n].end <= returned_) {
    out->logprobs.push_back(std::move(pending_[n].entry));
    ++n;
  }
  pending_.erase(pending_.begin(), pending_.begin() + n);
}

OutputText::Piece OutputText::Add(std::span<const int32_t> ids,
                                  std::span<const TokenLogprobs> logprobs) {
  Piece out;
  for (size_t i = 0; i < ids.size() && !stopped() && !finished_; ++i) {
    ++tokens_;
    auto text = decoder_.Add(ids[i]);
    const size_t start = fed_;
    if (text.ok()) {
      fed_ += text->size();
      std::string released = tokens_ <= min_tokens_ ? *std::move(text) : matcher_.Feed(*text);
      returned_ += released.size();
      out.text += released;
    }
    if (i < logprobs.size()) {
      pending_.push_back({OutputLogprob{ids[i], logprobs[i], start}, fed_});
    }
    Release(&out);
  }
  return out;
}

OutputText::Piece OutputText::Finish() {
  Piece out;
  if (finished_) return out;
  finished_ = true;
  if (!stopped()) {
    std::string tail = decoder_.Flush();
    fed_ += tail.size();
    std::string released = matcher_.Feed(tail);
    released += matcher_.Finish();
    returned_ += released.size();
    out.text = std::move(released);
  }
  if (!stopped()) {
    for (auto& p : pending_) out.logprobs.push_back(std::move(p.entry));
    pending_.clear();
  } else {
    Release(&out);
  }
  return out;
}

}  // namespace ss
