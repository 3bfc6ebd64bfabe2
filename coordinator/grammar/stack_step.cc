#include "coordinator/grammar/stack_step.h"

#include <algorithm>

namespace ss::grammar {
namespace {

uint64_t Key(int32_t node, int32_t parent) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(parent);
}

}  // namespace

int32_t FrameArena::Find(uint64_t key) const {
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  return base_ != nullptr ? base_->Find(key) : -1;
}

int32_t FrameArena::Intern(int32_t node, int32_t parent) {
  if (parent < 0) {
    int32_t id = FindBottom(node);
    if (id >= 0) return id;
    if (static_cast<size_t>(node) >= bottom_.size()) {
      bottom_.resize(std::max<size_t>(static_cast<size_t>(node) + 1, 2 * bottom_.size()), -1);
    }
    id = size();
    frames_.push_back({node, -1});
    bottom_[node] = id;
    bottom_set_.push_back(node);
    return id;
  }
  const uint64_t key = Key(node, parent);
  if (base_ != nullptr) {
    int32_t id = base_->Find(key);
    if (id >= 0) return id;
  }
  auto [it, inserted] = index_.emplace(key, 0);
  if (inserted) {
    it->second = size();
    frames_.push_back({node, parent});
  }
  return it->second;
}

void FrameArena::Clear() {
  frames_.clear();
  index_.clear();
  for (int32_t n : bottom_set_) bottom_[n] = -1;
  bottom_set_.clear();
  offset_ = base_ != nullptr ? base_->size() : 0;
}

void FrameArena::Compact(std::vector<int32_t>* roots) {
  std::vector<int32_t> remap(frames_.size(), -1);
  std::vector<Frame> kept;
  // Parents have smaller ids than their children, so one pass from the top down marks, and one
  // pass up renumbers.
  for (int32_t r : *roots) remap[r] = 0;
  for (size_t i = frames_.size(); i-- > 0;) {
    if (remap[i] >= 0 && frames_[i].parent >= 0) remap[frames_[i].parent] = 0;
  }
  for (size_t i = 0; i < frames_.size(); ++i) {
    if (remap[i] < 0) continue;
    remap[i] = static_cast<int32_t>(kept.size());
    Frame f = frames_[i];
    if (f.parent >= 0) f.parent = remap[f.parent];
    kept.push_back(f);
  }
  frames_ = std::move(kept);
  index_.clear();
  for (int32_t n : bottom_set_) bottom_[n] = -1;
  bottom_set_.clear();
  for (size_t i = 0; i < frames_.size(); ++i) {
    const Frame& f = frames_[i];
    if (f.parent < 0) {
      bottom_[f.node] = static_cast<int32_t>(i);
      bottom_set_.push_back(f.node);
    } else {
      index_.emplace(Key(f.node, f.parent), static_cast<int32_t>(i));
    }
  }
  for (int32_t& r : *roots) r = remap[r];
}

void StackStepper::Begin() {
  if (++epoch_ == 0) {
    std::fill(mark_.begin(), mark_.end(), 0);
    epoch_ = 1;
  }
  work_.clear();
}

void StackStepper::Push(int32_t f) { work_.push_back(f); }

StepResult StackStepper::Close(std::vector<int32_t>* out) {
  StepResult res;
  size_t steps = 0;
  while (!work_.empty()) {
    const int32_t f = work_.back();
    work_.pop_back();
    if (static_cast<size_t>(f) >= mark_.size()) {
      mark_.resize(std::max<size_t>(static_cast<size_t>(f) + 1, mark_.size() * 2), 0);
    }
    if (mark_[f] == epoch_) continue;
    mark_[f] = epoch_;
    ++total_work_;
    if (++steps > kMaxStepWork) {
      res.ok = false;
      return res;
    }
    const Frame fr = arena_->at(f);
    const Pda::Node& nd = pda_->nodes[fr.node];
    if (nd.HasInput()) {
      out->push_back(f);
      if (out->size() > kMaxStacks) {
        res.ok = false;
        return res;
      }
    }
    for (uint32_t k = nd.call_begin; k < nd.call_end; ++k) {
      const Pda::CallEdge& c = pda_->calls[k];
      const int32_t parent = c.tail ? fr.parent : arena_->Intern(c.ret, fr.parent);
      work_.push_back(arena_->Intern(pda_->rule_start[c.rule], parent));
    }
    if (nd.final) {
      if (fr.parent < 0) {
        res.popped = true;
      } else {
        work_.push_back(fr.parent);
      }
    }
  }
  return res;
}

StepResult StackStepper::Start(int32_t f, std::vector<int32_t>* tops) {
  Begin();
  Push(f);
  return Close(tops);
}

StepResult StackStepper::Byte(std::span<const int32_t> tops, uint8_t byte,
                              std::vector<int32_t>* out) {
  out->clear();
  Begin();
  total_work_ += tops.size();
  for (int32_t f : tops) {
    const Frame fr = arena_->at(f);
    const Pda::Node& nd = pda_->nodes[fr.node];
    for (uint32_t k = nd.byte_begin; k < nd.byte_end; ++k) {
      const Pda::ByteEdge& e = pda_->byte_edges[k];
      if (e.lo > byte) break;
      if (byte <= e.hi) work_.push_back(arena_->Intern(e.target, fr.parent));
    }
  }
  return Close(out);
}

StepResult StackStepper::Token(std::span<const int32_t> tops, int32_t token,
                               std::vector<int32_t>* out) {
  out->clear();
  Begin();
  for (int32_t f : tops) {
    const Frame fr = arena_->at(f);
    const Pda::Node& nd = pda_->nodes[fr.node];
    for (uint32_t k = nd.token_begin; k < nd.token_end; ++k) {
      const Pda::TokenEdge& e = pda_->token_edges[k];
      if (e.token == token) work_.push_back(arena_->Intern(e.target, fr.parent));
    }
  }
  return Close(out);
}

}  // namespace ss::grammar
