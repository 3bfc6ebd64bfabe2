// The pushdown automaton's run state and its steps (internal to ss_grammar). A parse state is a
// set of stacks; a stack is a chain of frames (node, parent frame), hash-consed in a FrameArena so
// that equal stacks are one id and stacks share their common bottoms (as XGrammar's persistent
// stack tree). Parent -1 is the bottom: for a matcher, the root rule's caller (popping it means
// the root is complete); for the token mask cache, an unknown context.
//
// Only frames whose node consumes input (byte or token edges) are kept in a state ("tops"); the
// closure (calls push, finished rules pop) runs after every step. Bounded: a step that would keep
// more than kMaxStacks stacks, or do more than kMaxStepWork closure steps, fails, and the caller
// rejects the token. Not thread-safe; one StackStepper per thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/grammar/pda.h"

namespace ss::grammar {

inline constexpr size_t kMaxStacks = 4096;
inline constexpr size_t kMaxStepWork = 1 << 16;

struct Frame {
  int32_t node;
  int32_t parent;
};

// Hash-consed frames. A layered arena reads its base (which must outlive it and stay unchanged
// while it is used) and adds new frames above the base's ids.
class FrameArena {
 public:
  explicit FrameArena(const FrameArena* base = nullptr) : base_(base) { Clear(); }
  int32_t Intern(int32_t node, int32_t parent);
  const Frame& at(int32_t id) const {
    return id < offset_ ? base_->at(id) : frames_[static_cast<size_t>(id - offset_)];
  }
  int32_t size() const { return offset_ + static_cast<int32_t>(frames_.size()); }
  // Drops this layer's own frames (and picks up the base's current size).
  void Clear();
  // Keeps only the frames reachable from `roots` (renumbered in place); for arenas with no base.
  void Compact(std::vector<int32_t>* roots);

 private:
  int32_t Find(uint64_t key) const;
  int32_t FindBottom(int32_t node) const {
    if (static_cast<size_t>(node) < bottom_.size() && bottom_[node] >= 0) return bottom_[node];
    return base_ != nullptr ? base_->FindBottom(node) : -1;
  }
  const FrameArena* base_;
  // Frames (node, -1), the most common ones, by node: no hashing.
  std::vector<int32_t> bottom_;
  std::vector<int32_t> bottom_set_;
  int32_t offset_ = 0;
  std::vector<Frame> frames_;
  absl::flat_hash_map<uint64_t, int32_t> index_;
};

struct StepResult {
  bool ok = true;       // false: a limit was hit
  bool popped = false;  // a stack popped its bottom frame
};

class StackStepper {
 public:
  StackStepper(const Pda& pda, FrameArena* arena) : pda_(&pda), arena_(arena) {}
  void set_arena(FrameArena* arena) { arena_ = arena; }

  // Closure of frame `f` into `tops` (appended, deduplicated within this call).
  StepResult Start(int32_t f, std::vector<int32_t>* tops);
  // Every stack of `tops` consumes `byte` (or the added token `token`); closure into `out`
  // (cleared first).
  StepResult Byte(std::span<const int32_t> tops, uint8_t byte, std::vector<int32_t>* out);
  StepResult Token(std::span<const int32_t> tops, int32_t token, std::vector<int32_t>* out);

  // Frames and edges processed by this stepper so far (a cost measure for budgets).
  uint64_t total_work() const { return total_work_; }

 private:
  void Begin();
  void Push(int32_t f);
  StepResult Close(std::vector<int32_t>* out);

  const Pda* pda_;
  FrameArena* arena_;
  std::vector<uint32_t> mark_;
  uint32_t epoch_ = 0;
  std::vector<int32_t> work_;
  uint64_t total_work_ = 0;
};

}  // namespace ss::grammar
