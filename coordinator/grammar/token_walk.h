// Runs many tokens through the automaton from one start state, sharing the work of common
// prefixes: the tokens come in byte-sorted order and the states of the previous token's prefix are
// kept per depth (the trie walk of XGrammar's token mask cache, over a sorted vocabulary). Internal
// to ss_grammar; one walker per thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/grammar/pda.h"
#include "coordinator/grammar/stack_step.h"
#include "coordinator/grammar/token_vocab.h"

namespace ss::grammar {

// A vocabulary's ordinary tokens (kNormal, non-empty) sorted by bytes, with their bytes laid out
// contiguously in that order (walks read them sequentially). Position p is the p-th token.
struct SortedVocab {
  std::vector<int32_t> ids;
  std::string bytes;
  std::vector<uint32_t> offsets;  // ids.size() + 1 entries
  std::string_view token(size_t p) const {
    return std::string_view(bytes).substr(offsets[p], offsets[p + 1] - offsets[p]);
  }
  size_t size() const { return ids.size(); }
};

enum class TokenOutcome : uint8_t {
  kAccepted,   // every byte consumed
  kRejected,   // no stack can consume every byte, whatever lies below the start stacks
  kUncertain,  // only with `follow`: depends on the frames below the start stack
};

class TokenWalker {
 public:
  // Walks the tokens at `positions` (ascending) of `sorted` from `start` (tops of one
  // state) and calls on_token(p, outcome) for each. With `follow` (the mask cache's
  // context-free mode, start frames with parent -1): a stack popping its bottom with bytes left
  // whose next byte is in *follow, or ending exactly there, makes the token kUncertain instead of
  // rejected/accepted. Without it, popping the bottom is the root finishing. Stops early, returning
  // false, once the stepper's total_work() passes `work_limit`; true when every token was walked.
  template <typename OnToken>
  bool Walk(StackStepper& stepper, const SortedVocab& sorted, std::span<const int32_t> start,
            std::span<const int32_t> positions, const ByteSet* follow, OnToken&& on_token,
            uint64_t work_limit = ~uint64_t{0}) {
    if (tops_.empty()) Grow(64);
    tops_[0].assign(start.begin(), start.end());
    popped_[0] = 0;
    unc_[0] = 0;
    size_t valid = 0;
    std::string_view prev;
    for (int32_t p : positions) {
      if (stepper.total_work() > work_limit) return false;
      std::string_view t = sorted.token(static_cast<size_t>(p));
      const size_t len = t.size();
      if (tops_.size() <= len) Grow(len + 1);
      size_t common = 0;
      const size_t lim = std::min({prev.size(), len, valid});
      while (common < lim && prev[common] == t[common]) ++common;
      size_t d = common;
      for (; d < len; ++d) {
        if (tops_[d].empty()) break;
        StepResult r = stepper.Byte(tops_[d], static_cast<uint8_t>(t[d]), &tops_[d + 1]);
        if (!r.ok) tops_[d + 1].clear();
        popped_[d + 1] = r.ok && r.popped;
        unc_[d + 1] =
            unc_[d] || (follow != nullptr &&
                        (!r.ok || (popped_[d] && ByteSetHas(*follow, static_cast<uint8_t>(t[d])))));
      }
      valid = d;
      prev = t;
      TokenOutcome out;
      if (d == len) {
        if (!tops_[len].empty()) {
          out = TokenOutcome::kAccepted;
        } else if (popped_[len]) {
          out = follow != nullptr ? TokenOutcome::kUncertain : TokenOutcome::kAccepted;
        } else {
          out = unc_[len] ? TokenOutcome::kUncertain : TokenOutcome::kRejected;
        }
      } else {
        const bool u = unc_[d] || (follow != nullptr && popped_[d] &&
                                   ByteSetHas(*follow, static_cast<uint8_t>(t[d])));
        out = u ? TokenOutcome::kUncertain : TokenOutcome::kRejected;
      }
      on_token(p, out);
    }
    return true;
  }

 private:
  void Grow(size_t n) {
    if (tops_.size() < n) {
      tops_.resize(n);
      popped_.resize(n);
      unc_.resize(n);
    }
  }
  std::vector<std::vector<int32_t>> tops_;
  std::vector<char> popped_;
  std::vector<char> unc_;
};

}  // namespace ss::grammar
