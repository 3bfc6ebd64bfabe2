// The pushdown automaton a grammar compiles to (internal to ss_grammar). Each rule is an NFA over
// bytes (code point classes become UTF-8 byte-range paths, so a token may end inside a character)
// whose edges also call other rules (push a return node) or take a token terminal (an added
// token's id). Epsilon edges are folded away: every node lists the byte, call and token edges of
// its epsilon closure and whether the closure holds the rule's final node.
//
// Compilation steps (BuildPda):
//   * small non-recursive rules are inlined into their callers (always when tiny, and when the
//     reference sits inside a repetition), so that the stack rarely has to pop inside a token;
//   * repetitions expand to copies: x{2,4} = x x (x x?)?, x* = a loop; copies too far from the
//     repetition's end for any token to reach it are marked as aliases of the first such copy
//     (they share its token mask cache entry);
//   * a call whose return node can only finish the caller is a tail call: it pushes nothing;
//   * left recursion (a rule reaching itself without consuming a byte) is an error naming the
//     rule, which makes every closure finite;
//   * FOLLOW sets: per rule, the bytes that may come right after it anywhere (for the token mask
//     cache's context-independent rejection).
// Limits: at most kMaxPdaNodes nodes and a bounded closure computation, else InvalidArgument.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/grammar/gbnf.h"
#include "coordinator/grammar/token_vocab.h"

namespace ss::grammar {

inline constexpr int32_t kMaxPdaNodes = 1 << 17;

using ByteSet = std::array<uint64_t, 4>;
inline bool ByteSetHas(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }

struct Pda {
  struct ByteEdge {
    uint8_t lo, hi;
    int32_t target;
  };
  struct CallEdge {
    int32_t rule;
    int32_t ret;
    bool tail;  // ret can only finish the caller: push nothing
  };
  struct TokenEdge {
    int32_t token;
    int32_t target;
  };
  struct Node {
    uint32_t byte_begin = 0, byte_end = 0;
    uint32_t call_begin = 0, call_end = 0;
    uint32_t token_begin = 0, token_end = 0;
    int32_t rule = -1;
    // A node whose every token walk gives the results of this (smaller) node, or -1: the copies
    // of a long repetition that no token can reach the end of from.
    int32_t mask_alias = -1;
    bool final = false;
    bool frame = false;  // may be the node of a stack frame (a rule start or an edge's target)
    bool HasInput() const { return byte_begin != byte_end || token_begin != token_end; }
  };
  std::vector<Node> nodes;
  std::vector<ByteEdge> byte_edges;
  std::vector<CallEdge> calls;
  std::vector<TokenEdge> token_edges;
  std::vector<int32_t> rule_start;
  std::vector<std::string> rule_names;
  std::vector<ByteSet> follow;  // per rule
  int32_t root = -1;
};

absl::StatusOr<Pda> BuildPda(const Grammar& g, const TokenVocab& vocab);

}  // namespace ss::grammar
