// A grammar compiled for one vocabulary: the pushdown automaton (pda.h) plus the token mask cache
// that makes a 129K-token mask cheap (XGrammar's adaptive token mask cache):
//
//   * The vocabulary's ordinary tokens sorted by bytes, so tokens sharing a prefix are walked once
//     (token_walk.h).
//   * For every automaton node a stack top may sit on, the tokens classified once at compile time
//     by running them from that node alone, with nothing known below it: accepted (some path
//     consumes every byte inside the node's rule), rejected (every path dies inside the rule, or
//     leaves it on a byte that may never follow the rule: pda.h's FOLLOW sets), or uncertain
//     (a path leaves the rule and what happens next depends on the stack below). Accepted sets are
//     stored as id lists or, when large, bitsets. At run time only the uncertain tokens are
//     checked against the real stack (grammar_matcher.h).
//
// Compile cost: one trie walk per node with byte edges, pruned to the tokens whose first byte the
// node accepts; dominated by nodes inside free text (a JSON string's characters), a few
// milliseconds each at 129K tokens. Copies of a long repetition share one entry where no token
// can tell them apart (pda.h). The walks together may do at most kMaskCacheBudget units of
// automaton work (frames and edges stepped; 2^27, about 1.7 s on the dev VM); the node whose walk
// passes it and every node after are left uncached and checked token by token at run time (slow
// masks for such grammars, but bounded compile time). bench/RESULTS.md ("Grammar token mask at 129K
// vocab") has the figures.
//
// Immutable after CompileGrammar returns: share it between threads and matchers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/grammar/pda.h"
#include "coordinator/grammar/token_vocab.h"
#include "coordinator/grammar/token_walk.h"

namespace ss::grammar {

inline constexpr uint64_t kMaskCacheBudget = uint64_t{1} << 27;

struct CompileOptions;

class CompiledGrammar {
 public:
  // The cached classification of one automaton node (see the file comment).
  struct NodeMask {
    std::vector<uint32_t> accepted_bits;  // bitset over ids, or empty (then accepted_ids)
    std::vector<int32_t> accepted_ids;
    std::vector<int32_t> uncertain;  // positions in sorted_ids(), ascending
    // Past the compile budget: nothing cached, every token whose first byte the node takes is
    // checked at run time.
    bool uncached = false;
  };

  const TokenVocab& vocab() const { return *vocab_; }
  const Pda& pda() const { return pda_; }
  // Ordinary tokens (kNormal, non-empty), sorted by their bytes.
  std::span<const int32_t> sorted_ids() const { return sorted_->ids; }
  const SortedVocab& sorted_vocab() const { return *sorted_; }
  // The mask cache entry of `node`; nullptr for a node that consumes no bytes.
  const NodeMask* node_mask(int32_t node) const {
    int32_t i = mask_index_[static_cast<size_t>(node)];
    return i < 0 ? nullptr : &masks_[static_cast<size_t>(i)];
  }
  // Positions in sorted_ids() of the tokens whose first byte `node` takes, ascending.
  void FirstBytePositions(int32_t node, std::vector<int32_t>* positions) const;
  bool is_stop(int32_t id) const { return stop_[static_cast<size_t>(id)]; }
  int32_t bitmask_words() const { return (vocab_->size() + 31) / 32; }

  // Statistics (for benchmarks and logs).
  double compile_seconds() const { return compile_seconds_; }
  size_t cached_nodes() const { return masks_.size(); }
  size_t uncertain_total() const;
  // Bytes held by the mask cache (not the automaton, nor the sorted vocabulary it shares).
  size_t mask_cache_bytes() const;
  // Work the mask cache took to build, in StackStepper::total_work() units (see kMaskCacheBudget).
  uint64_t mask_cache_work() const { return mask_cache_work_; }

 private:
  friend absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileGrammar(
      std::string_view gbnf, std::shared_ptr<const TokenVocab> vocab,
      const CompileOptions& options);
  CompiledGrammar() = default;
  void BuildMaskCache(uint64_t budget);

  std::shared_ptr<const TokenVocab> vocab_;
  Pda pda_;
  std::shared_ptr<const SortedVocab> sorted_;  // shared by the grammars of one vocabulary
  std::vector<int32_t> first_byte_begin_;      // 257 entries: positions by first byte
  std::vector<int32_t> mask_index_;            // per node
  std::vector<NodeMask> masks_;
  std::vector<bool> stop_;
  double compile_seconds_ = 0;
  uint64_t mask_cache_work_ = 0;
};

// Parses (gbnf.h), builds the automaton (pda.h) and the mask cache. Errors: InvalidArgument from
// the parser and the automaton builder (undefined rules, left recursion, limits, token terminals
// that name no added token).
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileGrammar(
    std::string_view gbnf, std::shared_ptr<const TokenVocab> vocab);

// Knobs for tests and benchmarks.
struct CompileOptions {
  uint64_t mask_cache_budget = kMaskCacheBudget;
};
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileGrammar(
    std::string_view gbnf, std::shared_ptr<const TokenVocab> vocab, const CompileOptions& options);

// Thread-safe bounded LRU of compiled grammars keyed by the GBNF text, for one vocabulary. Errors
// are not cached. Two threads asking for the same new grammar at once may both compile it (the
// lock is not held while compiling); both get a valid result.
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t max_entries);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(std::string_view gbnf);
  size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammar>>;
  std::shared_ptr<const TokenVocab> vocab_;
  const size_t max_entries_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ss::grammar
