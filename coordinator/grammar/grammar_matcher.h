// The per-sequence constrained-decoding state: which tokens may come next under a compiled
// grammar (compiled_grammar.h), and advancing by the token that was sampled.
//
// Token semantics:
//   * An ordinary vocab token is allowed iff the grammar can consume ALL its bytes from the
//     current state. Classes and `.` match whole UTF-8 code points, but the automaton runs on
//     bytes, so a token may end inside a character and the next token continues it.
//   * An added (special) token is allowed only where a token terminal names it.
//   * Stop tokens (TokenVocab::stop_ids) are allowed iff the root rule can be complete here
//     (CanTerminate); once one is accepted the matcher is terminated and allows nothing.
//   * Unused ids are never allowed.
// Limits: a token whose step would keep more than kMaxStacks parse stacks (stack_step.h), or do
// more than kMaxStepWork closure work, is rejected by AcceptToken. The mask cache classifies
// tokens per parse stack (compiled_grammar.h), so in that overload case the mask may allow a
// token AcceptToken then rejects; it never forbids one AcceptToken would accept.
//
// Mask cost: zeroing the mask, one cached accepted set OR'ed in per distinct stack-top node, and
// a walk of the top nodes' uncertain tokens (a few hundred to a few thousand in JSON grammars)
// from the real stacks: per stack while there are at most kPerStackWalks, else one walk of the
// union from all stacks. Nodes left uncached by the compile budget add every token whose first
// byte they take.
//
// Threading: one matcher per sequence, used from one thread at a time (FillNextTokenBitmask is
// const but uses scratch buffers). Copyable (a copy is an independent state, e.g. for trying
// tokens). The compiled grammar is shared and must not change (it cannot: it is const).
// Memory: the matcher's stack frames grow with the accepted text and are compacted periodically
// to those still reachable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "coordinator/grammar/compiled_grammar.h"
#include "coordinator/grammar/stack_step.h"
#include "coordinator/grammar/token_walk.h"

namespace ss::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  GrammarMatcher(const GrammarMatcher& other);
  GrammarMatcher& operator=(const GrammarMatcher& other);

  // Advances by `id` if allowed; false (and unchanged) when not.
  bool AcceptToken(int32_t id);
  // Advances by `bytes` as ordinary text (tests, forced prefixes); false (and unchanged) when the
  // grammar cannot consume all of it. After termination always false (except for empty text).
  bool AcceptString(std::string_view bytes);
  // bitmask.size() must be (vocab size + 31) / 32; bit (id % 32) of word id / 32 set = allowed.
  void FillNextTokenBitmask(std::span<uint32_t> bitmask) const;
  // The root rule can be complete here: stop tokens are allowed.
  bool CanTerminate() const { return !terminated_ && can_terminate_; }
  // A stop token was accepted.
  bool IsTerminated() const { return terminated_; }

  // Whether the last AcceptToken / AcceptString that returned false did so because of the limits
  // above rather than the grammar (for logs and tests).
  bool last_rejection_hit_limit() const { return last_rejection_hit_limit_; }

  // The number of parse stacks live now, and of stack frames held (for tests and benchmarks).
  size_t num_stacks() const { return tops_.size(); }
  size_t num_frames() const { return static_cast<size_t>(arena_.size()); }

 private:
  bool AcceptBytes(std::string_view bytes);
  void MaybeCompact();

  std::shared_ptr<const CompiledGrammar> g_;
  FrameArena arena_;
  std::vector<int32_t> tops_;
  bool can_terminate_ = false;
  bool terminated_ = false;
  bool last_rejection_hit_limit_ = false;
  static constexpr int32_t kCompactAbove = 1 << 16;
  static constexpr size_t kPerStackWalks = 8;
  int32_t compact_at_ = kCompactAbove;
  StackStepper stepper_;
  std::vector<int32_t> next_;
  std::vector<int32_t> cur_;
  // Scratch for FillNextTokenBitmask.
  mutable FrameArena scratch_arena_;
  mutable StackStepper scratch_stepper_;
  mutable std::vector<int32_t> scratch_nodes_;
  mutable std::vector<int32_t> scratch_positions_;
  mutable std::vector<int32_t> scratch_first_;
  mutable std::vector<uint8_t> scratch_seen_;
  mutable TokenWalker scratch_walker_;
};

}  // namespace ss::grammar
