#include "coordinator/grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>

namespace ss::grammar {
namespace {}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : g_(std::move(grammar)),
      stepper_(g_->pda(), &arena_),
      scratch_arena_(&arena_),
      scratch_stepper_(g_->pda(), &scratch_arena_) {
  const Pda& pda = g_->pda();
  const int32_t start = arena_.Intern(pda.rule_start[static_cast<size_t>(pda.root)], -1);
  StepResult r = stepper_.Start(start, &tops_);
  can_terminate_ = r.ok && r.popped;
  if (!r.ok) tops_.clear();
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher& o)
    : g_(o.g_),
      arena_(o.arena_),
      tops_(o.tops_),
      can_terminate_(o.can_terminate_),
      terminated_(o.terminated_),
      last_rejection_hit_limit_(o.last_rejection_hit_limit_),
      compact_at_(o.compact_at_),
      stepper_(g_->pda(), &arena_),
      scratch_arena_(&arena_),
      scratch_stepper_(g_->pda(), &scratch_arena_) {}

GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher& o) {
  if (this == &o) return *this;
  g_ = o.g_;
  arena_ = o.arena_;
  tops_ = o.tops_;
  can_terminate_ = o.can_terminate_;
  terminated_ = o.terminated_;
  last_rejection_hit_limit_ = o.last_rejection_hit_limit_;
  compact_at_ = o.compact_at_;
  stepper_ = StackStepper(g_->pda(), &arena_);
  scratch_arena_ = FrameArena(&arena_);
  scratch_stepper_ = StackStepper(g_->pda(), &scratch_arena_);
  return *this;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  cur_ = tops_;
  bool popped = false;
  last_rejection_hit_limit_ = false;
  for (char c : bytes) {
    if (cur_.empty()) return false;
    StepResult r = stepper_.Byte(cur_, static_cast<uint8_t>(c), &next_);
    if (!r.ok) {
      last_rejection_hit_limit_ = true;
      return false;
    }
    popped = r.popped;
    cur_.swap(next_);
  }
  if (cur_.empty() && !popped) return false;
  tops_.swap(cur_);
  can_terminate_ = popped;
  MaybeCompact();
  return true;
}

bool GrammarMatcher::AcceptString(std::string_view bytes) {
  if (bytes.empty()) return true;
  if (terminated_) return false;
  return AcceptBytes(bytes);
}

bool GrammarMatcher::AcceptToken(int32_t id) {
  const TokenVocab& v = g_->vocab();
  if (terminated_ || id < 0 || id >= v.size()) return false;
  if (g_->is_stop(id) && can_terminate_) {
    terminated_ = true;
    tops_.clear();
    return true;
  }
  switch (v.kind[static_cast<size_t>(id)]) {
    case TokenVocab::Kind::kUnused:
      return false;
    case TokenVocab::Kind::kNormal:
      return !v.bytes[static_cast<size_t>(id)].empty() &&
             AcceptBytes(v.bytes[static_cast<size_t>(id)]);
    case TokenVocab::Kind::kAdded: {
      StepResult r = stepper_.Token(tops_, id, &next_);
      last_rejection_hit_limit_ = !r.ok;
      if (!r.ok || (next_.empty() && !r.popped)) return false;
      tops_.swap(next_);
      can_terminate_ = r.popped;
      MaybeCompact();
      return true;
    }
  }
  return false;
}

void GrammarMatcher::MaybeCompact() {
  if (arena_.size() <= compact_at_) return;
  arena_.Compact(&tops_);
  compact_at_ = std::max(kCompactAbove, 2 * arena_.size());
}

void GrammarMatcher::FillNextTokenBitmask(std::span<uint32_t> bitmask) const {
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  if (terminated_) return;
  const CompiledGrammar& g = *g_;
  const Pda& pda = g.pda();
  const size_t nwords = std::min<size_t>(bitmask.size(), static_cast<size_t>(g.bitmask_words()));
  auto set = [&](int32_t id) {
    if (static_cast<size_t>(id >> 5) < nwords) bitmask[id >> 5] |= 1u << (id & 31);
  };
  auto has = [&](int32_t id) {
    return static_cast<size_t>(id >> 5) < nwords && ((bitmask[id >> 5] >> (id & 31)) & 1);
  };
  scratch_nodes_.clear();
  for (int32_t f : tops_) scratch_nodes_.push_back(arena_.at(f).node);
  std::sort(scratch_nodes_.begin(), scratch_nodes_.end());
  scratch_nodes_.erase(std::unique(scratch_nodes_.begin(), scratch_nodes_.end()),
                       scratch_nodes_.end());
  for (int32_t n : scratch_nodes_) {
    const Pda::Node& nd = pda.nodes[static_cast<size_t>(n)];
    for (uint32_t k = nd.token_begin; k < nd.token_end; ++k) set(pda.token_edges[k].token);
    const CompiledGrammar::NodeMask* m = g.node_mask(n);
    if (m == nullptr) continue;
    if (!m->accepted_bits.empty()) {
      for (size_t w = 0; w < nwords; ++w) bitmask[w] |= m->accepted_bits[w];
    } else {
      for (int32_t id : m->accepted_ids) set(id);
    }
  }
  // Uncertain tokens (and those of uncached nodes) not allowed yet, walked from the real stacks:
  // from each stack its own node's list while there are few stacks (cheapest), else the union of
  // the lists from all stacks at once (one walk, and exactly what AcceptToken does under the
  // stack limits).
  std::span<const int32_t> sorted = g.sorted_ids();
  if (scratch_seen_.size() != sorted.size()) scratch_seen_.assign(sorted.size(), 0);
  auto walk = [&](std::span<const int32_t> start) {
    if (scratch_positions_.empty()) return;
    scratch_arena_.Clear();
    scratch_walker_.Walk(scratch_stepper_, g.sorted_vocab(), start, scratch_positions_, nullptr,
                         [&](int32_t p, TokenOutcome o) {
                           if (o == TokenOutcome::kAccepted) set(sorted[static_cast<size_t>(p)]);
                         });
  };
  auto add = [&](int32_t node) {
    const CompiledGrammar::NodeMask* m = g.node_mask(node);
    if (m == nullptr) return false;
    std::span<const int32_t> src = m->uncertain;
    if (m->uncached) {
      g.FirstBytePositions(node, &scratch_first_);
      src = scratch_first_;
    }
    for (int32_t p : src) {
      if (!scratch_seen_[p] && !has(sorted[static_cast<size_t>(p)])) {
        scratch_seen_[p] = 1;
        scratch_positions_.push_back(p);
      }
    }
    return !src.empty();
  };
  auto unmark = [&] {
    for (int32_t p : scratch_positions_) scratch_seen_[p] = 0;
  };
  if (tops_.size() <= kPerStackWalks) {
    for (int32_t f : tops_) {
      scratch_positions_.clear();
      add(arena_.at(f).node);
      unmark();
      walk(std::span<const int32_t>(&f, 1));
    }
  } else {
    scratch_positions_.clear();
    int lists = 0;
    for (int32_t n : scratch_nodes_) lists += add(n);
    unmark();
    if (lists > 1) std::sort(scratch_positions_.begin(), scratch_positions_.end());
    walk(tops_);
  }
  if (can_terminate_) {
    for (int32_t id : g.vocab().stop_ids) {
      if (id >= 0 && id < g.vocab().size() &&
          g.vocab().kind[static_cast<size_t>(id)] != TokenVocab::Kind::kUnused) {
        set(id);
      }
    }
  }
}

}  // namespace ss::grammar
