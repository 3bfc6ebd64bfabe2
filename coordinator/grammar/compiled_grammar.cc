#include "coordinator/grammar/compiled_grammar.h"

#include <algorithm>
#include <chrono>

#include "absl/base/const_init.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/grammar/gbnf.h"
#include "coordinator/grammar/stack_step.h"
#include "coordinator/grammar/token_walk.h"

namespace ss::grammar {

namespace {

// The vocabulary's ordinary tokens sorted by bytes. The last vocabulary's order is kept while
// that vocabulary lives (one model per process: every compile after the first reuses it).
std::shared_ptr<const SortedVocab> Sorted(const std::shared_ptr<const TokenVocab>& vocab) {
  static absl::Mutex mu(absl::kConstInit);
  static std::weak_ptr<const TokenVocab>* last_vocab = new std::weak_ptr<const TokenVocab>();
  static std::shared_ptr<const SortedVocab>* last_sorted = new std::shared_ptr<const SortedVocab>();
  {
    absl::MutexLock l(&mu);
    if (last_vocab->lock() == vocab) return *last_sorted;
  }
  const TokenVocab& v = *vocab;
  auto sorted = std::make_shared<SortedVocab>();
  std::vector<int32_t>& ids = sorted->ids;
  for (int32_t id = 0; id < v.size(); ++id) {
    if (v.kind[id] == TokenVocab::Kind::kNormal && !v.bytes[id].empty()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return v.bytes[a] < v.bytes[b]; });
  sorted->offsets.push_back(0);
  for (int32_t id : ids) {
    sorted->bytes += v.bytes[id];
    sorted->offsets.push_back(static_cast<uint32_t>(sorted->bytes.size()));
  }
  absl::MutexLock l(&mu);
  *last_vocab = vocab;
  *last_sorted = sorted;
  return sorted;
}

}  // namespace

size_t CompiledGrammar::uncertain_total() const {
  size_t n = 0;
  for (const NodeMask& m : masks_) n += m.uncertain.size();
  return n;
}

size_t CompiledGrammar::mask_cache_bytes() const {
  size_t n = mask_index_.size() * sizeof(int32_t);
  for (const NodeMask& m : masks_) {
    n += sizeof(NodeMask) + m.accepted_bits.size() * sizeof(uint32_t) +
         (m.accepted_ids.size() + m.uncertain.size()) * sizeof(int32_t);
  }
  return n;
}

void CompiledGrammar::FirstBytePositions(int32_t node, std::vector<int32_t>* positions) const {
  const Pda::Node& nd = pda_.nodes[static_cast<size_t>(node)];
  positions->clear();
  int next = 0;  // byte edges are sorted by lo; visit each first byte once
  for (uint32_t k = nd.byte_begin; k < nd.byte_end; ++k) {
    const int lo = std::max<int>(pda_.byte_edges[k].lo, next);
    const int hi = pda_.byte_edges[k].hi;
    if (lo > hi) continue;
    for (int32_t p = first_byte_begin_[lo]; p < first_byte_begin_[hi + 1]; ++p) {
      positions->push_back(p);
    }
    next = hi + 1;
  }
}

void CompiledGrammar::BuildMaskCache(uint64_t budget) {
  const int32_t nwords = bitmask_words();
  sorted_ = Sorted(vocab_);
  const std::vector<int32_t>& sorted_ids_ = sorted_->ids;
  first_byte_begin_.assign(257, 0);
  for (size_t p = 0; p < sorted_->size(); ++p) {
    ++first_byte_begin_[static_cast<uint8_t>(sorted_->bytes[sorted_->offsets[p]]) + 1];
  }
  for (int b = 0; b < 256; ++b) first_byte_begin_[b + 1] += first_byte_begin_[b];

  mask_index_.assign(pda_.nodes.size(), -1);
  FrameArena arena;
  StackStepper stepper(pda_, &arena);
  TokenWalker walker;
  std::vector<int32_t> positions, accepted;
  for (size_t n = 0; n < pda_.nodes.size(); ++n) {
    const Pda::Node& nd = pda_.nodes[n];
    if (!nd.frame || nd.byte_begin == nd.byte_end) continue;
    if (nd.mask_alias >= 0 && mask_index_[nd.mask_alias] >= 0) {
      mask_index_[n] = mask_index_[nd.mask_alias];
      continue;
    }
    mask_index_[n] = static_cast<int32_t>(masks_.size());
    NodeMask uncached;
    uncached.uncached = true;
    if (stepper.total_work() >= budget) {
      masks_.push_back(std::move(uncached));
      continue;
    }
    FirstBytePositions(static_cast<int32_t>(n), &positions);
    arena.Clear();
    const int32_t start = arena.Intern(static_cast<int32_t>(n), -1);
    NodeMask m;
    accepted.clear();
    const bool complete = walker.Walk(
        stepper, *sorted_, std::span<const int32_t>(&start, 1), positions,
        &pda_.follow[static_cast<size_t>(nd.rule)],
        [&](int32_t p, TokenOutcome o) {
          if (o == TokenOutcome::kAccepted) {
            accepted.push_back(sorted_ids_[p]);
          } else if (o == TokenOutcome::kUncertain) {
            m.uncertain.push_back(p);
          }
        },
        budget);
    if (!complete) {
      masks_.push_back(std::move(uncached));
      continue;
    }
    if (accepted.size() > static_cast<size_t>(nwords)) {
      m.accepted_bits.assign(nwords, 0);
      for (int32_t id : accepted) m.accepted_bits[id >> 5] |= 1u << (id & 31);
    } else {
      std::sort(accepted.begin(), accepted.end());
      m.accepted_ids = accepted;
    }
    masks_.push_back(std::move(m));
  }
  mask_cache_work_ = stepper.total_work();
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileGrammar(
    std::string_view gbnf, std::shared_ptr<const TokenVocab> vocab) {
  return CompileGrammar(gbnf, std::move(vocab), CompileOptions());
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileGrammar(
    std::string_view gbnf, std::shared_ptr<const TokenVocab> vocab, const CompileOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (vocab == nullptr || vocab->kind.size() != vocab->bytes.size()) {
    return absl::InvalidArgumentError("CompileGrammar: no vocabulary or kind/bytes size mismatch");
  }
  absl::StatusOr<Grammar> g = ParseGbnf(gbnf);
  if (!g.ok()) return g.status();
  absl::StatusOr<Pda> pda = BuildPda(*g, *vocab);
  if (!pda.ok()) return pda.status();
  std::shared_ptr<CompiledGrammar> cg(new CompiledGrammar());
  cg->vocab_ = std::move(vocab);
  cg->pda_ = std::move(*pda);
  cg->stop_.assign(cg->vocab_->size(), false);
  for (int32_t id : cg->vocab_->stop_ids) {
    if (id >= 0 && id < cg->vocab_->size()) cg->stop_[id] = true;
  }
  cg->BuildMaskCache(options.mask_cache_budget);
  cg->compile_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(cg));
}

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t max_entries)
    : vocab_(std::move(vocab)), max_entries_(std::max<size_t>(max_entries, 1)) {}

size_t GrammarCache::size() const {
  absl::MutexLock l(&mu_);
  return lru_.size();
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(std::string_view gbnf) {
  {
    absl::MutexLock l(&mu_);
    auto it = index_.find(std::string(gbnf));
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> cg = CompileGrammar(gbnf, vocab_);
  if (!cg.ok()) return cg.status();
  absl::MutexLock l(&mu_);
  auto it = index_.find(std::string(gbnf));
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  lru_.emplace_front(std::string(gbnf), *cg);
  index_.emplace(lru_.front().first, lru_.begin());
  while (lru_.size() > max_entries_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return *cg;
}

}  // namespace ss::grammar
