#include "coordinator/grammar/pda.h"

#include <algorithm>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/grammar/utf8_ranges.h"

namespace ss::grammar {
namespace {

constexpr int64_t kInlineTiny = 24;
constexpr int64_t kInlineInLoop = 400;
constexpr int kMaxInlineDepth = 4;
constexpr int64_t kMaxClosureWork = int64_t{1} << 26;
constexpr int kMaxFixpointPasses = 1000;
constexpr int64_t kWeightCap = int64_t{1} << 30;

struct RawNode {
  std::vector<int32_t> eps;
  std::vector<Pda::ByteEdge> bytes;
  std::vector<std::pair<int32_t, int32_t>> calls;  // (rule, ret)
  std::vector<Pda::TokenEdge> tokens;
  int32_t rule = -1;
  int32_t alias = -1;
  bool final = false;
};

using Kind = GrammarExpr::Kind;

class Builder {
 public:
  Builder(const Grammar& g, const TokenVocab& v) : g_(g), v_(v) {}

  absl::StatusOr<Pda> Run() {
    const int32_t nrules = static_cast<int32_t>(g_.rule_names.size());
    ComputeWeights();
    ComputeNonRecursive();
    ComputeMinBytes();
    for (int32_t id = 0; id < v_.size(); ++id) {
      if (v_.kind[id] == TokenVocab::Kind::kNormal) {
        max_token_bytes_ = std::max<int64_t>(max_token_bytes_, v_.bytes[id].size());
      }
    }
    pda_.rule_names = g_.rule_names;
    pda_.rule_start.assign(nrules, -1);
    std::vector<int32_t> finals(nrules, -1);
    for (int32_t r = 0; r < nrules; ++r) {
      pda_.rule_start[r] = New(r);
      finals[r] = New(r);
      if (pda_.rule_start[r] < 0 || finals[r] < 0) return TooLarge();
      raw_[finals[r]].final = true;
    }
    for (int32_t r = 0; r < nrules; ++r) {
      absl::Status s = Build(g_.rule_body[r], pda_.rule_start[r], finals[r], r, false, 0);
      if (!s.ok()) return s;
    }
    pda_.root = g_.root;
    if (absl::Status s = Expand(); !s.ok()) return s;
    Nullable();
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    Follow();
    return std::move(pda_);
  }

 private:
  absl::Status TooLarge() const {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar too large: more than ", kMaxPdaNodes, " automaton states"));
  }

  int32_t New(int32_t rule) {
    if (raw_.size() >= static_cast<size_t>(kMaxPdaNodes)) return -1;
    raw_.emplace_back();
    raw_.back().rule = rule;
    return static_cast<int32_t>(raw_.size() - 1);
  }

  // Rough automaton size of each expression (for inlining decisions), bottom-up over the IR.
  void ComputeWeights() {
    weight_.assign(g_.exprs.size(), 1);
    // Children always have smaller indices than their parent (the parser adds them first).
    for (size_t i = 0; i < g_.exprs.size(); ++i) {
      const GrammarExpr& e = g_.exprs[i];
      int64_t w = 1;
      switch (e.kind) {
        case Kind::kSequence:
        case Kind::kAlternation:
          for (int32_t c : e.children) w += weight_[c];
          break;
        case Kind::kLiteral:
          w = static_cast<int64_t>(e.text.size()) + 1;
          break;
        case Kind::kCharClass:
          w = 8;
          break;
        case Kind::kRuleRef:
          w = 4;
          break;
        case Kind::kToken:
          w = 1;
          break;
        case Kind::kRepeat: {
          int64_t copies = e.max == kUnbounded ? std::max<int64_t>(e.min, 1) + 1 : e.max;
          w = weight_[e.children[0]] * std::max<int64_t>(copies, 1) + 2;
          break;
        }
      }
      weight_[i] = std::min(w, kWeightCap);
    }
  }

  // A lower bound of the bytes each expression consumes (token terminals count as one: a walk of
  // ordinary tokens cannot pass them). Rule bounds start at 0 and only grow, so every pass gives
  // lower bounds; a few passes settle the usual grammars.
  void ComputeMinBytes() {
    min_bytes_.assign(g_.exprs.size(), 0);
    std::vector<int64_t> rule_min(g_.rule_names.size(), 0);
    for (int pass = 0; pass < 4; ++pass) {
      for (size_t i = 0; i < g_.exprs.size(); ++i) {
        const GrammarExpr& e = g_.exprs[i];
        int64_t m = 0;
        switch (e.kind) {
          case Kind::kSequence:
            for (int32_t c : e.children) m += min_bytes_[c];
            break;
          case Kind::kAlternation:
            m = kWeightCap;
            for (int32_t c : e.children) m = std::min(m, min_bytes_[c]);
            break;
          case Kind::kLiteral:
            m = static_cast<int64_t>(e.text.size());
            break;
          case Kind::kCharClass:
          case Kind::kToken:
            m = 1;
            break;
          case Kind::kRuleRef:
            m = rule_min[e.rule];
            break;
          case Kind::kRepeat:
            m = min_bytes_[e.children[0]] * e.min;
            break;
        }
        min_bytes_[i] = std::min(m, kWeightCap);
      }
      for (size_t r = 0; r < rule_min.size(); ++r) rule_min[r] = min_bytes_[g_.rule_body[r]];
    }
  }

  // Copies of a repetition far enough from its end that no token can reach the end behave alike
  // for every token: the first such copy stands for the others in the token mask cache.
  struct CopyAliaser {
    int64_t reach;  // copies one token can span; < 0: aliasing off
    int64_t rep_begin = -1, rep_size = 0;
    void Copy(std::vector<RawNode>& raw, size_t begin, size_t end, int64_t remaining_after) {
      if (reach < 0 || remaining_after <= reach) return;
      if (rep_begin < 0) {
        rep_begin = static_cast<int64_t>(begin);
        rep_size = static_cast<int64_t>(end - begin);
        return;
      }
      if (static_cast<int64_t>(end - begin) != rep_size) return;
      for (int64_t k = 0; k < rep_size; ++k) {
        raw[begin + k].alias = static_cast<int32_t>(rep_begin + k);
      }
    }
  };

  // Rules that reach no rule that reaches them (Kahn over callee counts).
  void ComputeNonRecursive() {
    const size_t nrules = g_.rule_names.size();
    std::vector<std::vector<int32_t>> callers(nrules);
    std::vector<int32_t> pending(nrules, 0);
    std::vector<int32_t> stack;
    std::vector<int32_t> seen(nrules, -1);
    for (size_t r = 0; r < nrules; ++r) {
      stack.assign(1, g_.rule_body[r]);
      while (!stack.empty()) {
        const GrammarExpr& e = g_.exprs[stack.back()];
        stack.pop_back();
        if (e.kind == Kind::kRuleRef && seen[e.rule] != static_cast<int32_t>(r)) {
          seen[e.rule] = static_cast<int32_t>(r);
          callers[e.rule].push_back(static_cast<int32_t>(r));
          ++pending[r];
        }
        for (int32_t c : e.children) stack.push_back(c);
      }
    }
    nonrec_.assign(nrules, false);
    std::vector<int32_t> ready;
    for (size_t r = 0; r < nrules; ++r) {
      if (pending[r] == 0) ready.push_back(static_cast<int32_t>(r));
    }
    while (!ready.empty()) {
      int32_t r = ready.back();
      ready.pop_back();
      nonrec_[r] = true;
      for (int32_t c : callers[r]) {
        if (--pending[c] == 0) ready.push_back(c);
      }
    }
  }

  absl::StatusOr<int32_t> TokenId(const GrammarExpr& e) {
    if (e.token_id >= 0) {
      if (e.token_id >= v_.size() || v_.kind[e.token_id] != TokenVocab::Kind::kAdded) {
        return absl::InvalidArgumentError(
            absl::StrCat("token terminal <[", e.token_id, "]> is not an added token"));
      }
      return e.token_id;
    }
    if (added_.empty()) {
      for (int32_t id = 0; id < v_.size(); ++id) {
        if (v_.kind[id] == TokenVocab::Kind::kAdded) added_.emplace(v_.bytes[id], id);
      }
    }
    // `<x>` names the added token "<x>", or else the one whose content is "x" (DeepSeek's
    // ｜DSML｜ has no angle brackets).
    auto it = added_.find(e.text);
    if (it == added_.end()) it = added_.find(e.text.substr(1, e.text.size() - 2));
    if (it == added_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token terminal ", e.text, " is not an added token of the vocabulary"));
    }
    return it->second;
  }

  absl::Status BuildClass(const GrammarExpr& e, int32_t from, int32_t to, int32_t rule) {
    // Byte paths with shared suffixes, so that a class stays one path per remaining length.
    absl::flat_hash_map<std::string, int32_t> suffix_node;
    for (auto [lo, hi] : e.ranges) {
      for (const ByteSeq& seq : Utf8Sequences(lo, hi)) {
        int32_t next = to;
        std::string key;
        for (size_t k = seq.size(); k-- > 1;) {
          key.push_back(static_cast<char>(seq[k].lo));
          key.push_back(static_cast<char>(seq[k].hi));
          auto [it, inserted] = suffix_node.emplace(key, -1);
          if (inserted) {
            int32_t n = New(rule);
            if (n < 0) return TooLarge();
            raw_[n].bytes.push_back({seq[k].lo, seq[k].hi, next});
            it->second = n;
          }
          next = it->second;
        }
        raw_[from].bytes.push_back({seq[0].lo, seq[0].hi, next});
      }
    }
    return absl::OkStatus();
  }

  // Adds edges from `from` to `to` for expression `x`; never adds edges into `from` or out of `to`.
  // Recursion depth: the IR's nesting (bounded by the parser) times kMaxInlineDepth.
  absl::Status Build(int32_t x, int32_t from, int32_t to, int32_t rule, bool in_loop,
                     int inline_depth) {
    const GrammarExpr& e = g_.exprs[x];
    switch (e.kind) {
      case Kind::kSequence: {
        if (e.children.empty()) {
          raw_[from].eps.push_back(to);
          return absl::OkStatus();
        }
        int32_t cur = from;
        for (size_t i = 0; i < e.children.size(); ++i) {
          int32_t next = i + 1 == e.children.size() ? to : New(rule);
          if (next < 0) return TooLarge();
          if (absl::Status s = Build(e.children[i], cur, next, rule, in_loop, inline_depth);
              !s.ok()) {
            return s;
          }
          cur = next;
        }
        return absl::OkStatus();
      }
      case Kind::kAlternation:
        for (int32_t c : e.children) {
          if (absl::Status s = Build(c, from, to, rule, in_loop, inline_depth); !s.ok()) return s;
        }
        return absl::OkStatus();
      case Kind::kLiteral: {
        if (e.text.empty()) {
          raw_[from].eps.push_back(to);
          return absl::OkStatus();
        }
        int32_t cur = from;
        for (size_t i = 0; i < e.text.size(); ++i) {
          int32_t next = i + 1 == e.text.size() ? to : New(rule);
          if (next < 0) return TooLarge();
          uint8_t b = static_cast<uint8_t>(e.text[i]);
          raw_[cur].bytes.push_back({b, b, next});
          cur = next;
        }
        return absl::OkStatus();
      }
      case Kind::kCharClass:
        return BuildClass(e, from, to, rule);
      case Kind::kRuleRef: {
        const int32_t c = e.rule;
        if (nonrec_[c] && inline_depth < kMaxInlineDepth &&
            (weight_[g_.rule_body[c]] <= kInlineTiny ||
             (in_loop && weight_[g_.rule_body[c]] <= kInlineInLoop))) {
          return Build(g_.rule_body[c], from, to, rule, in_loop, inline_depth + 1);
        }
        raw_[from].calls.emplace_back(c, to);
        return absl::OkStatus();
      }
      case Kind::kToken: {
        absl::StatusOr<int32_t> id = TokenId(e);
        if (!id.ok()) return id.status();
        raw_[from].tokens.push_back({*id, to});
        return absl::OkStatus();
      }
      case Kind::kRepeat: {
        const int32_t child = e.children[0];
        const bool loop = in_loop || e.max > 1;
        if (e.max == 0) {
          raw_[from].eps.push_back(to);
          return absl::OkStatus();
        }
        const int64_t per_copy = min_bytes_[child];
        const int64_t reach = per_copy >= 1 ? max_token_bytes_ / per_copy + 2 : -1;
        CopyAliaser mandatory{reach};
        int32_t cur = from;
        for (uint32_t i = 0; i < e.min; ++i) {
          const size_t begin = raw_.size();
          int32_t next = (i + 1 == e.min && e.max == e.min) ? to : New(rule);
          if (next < 0) return TooLarge();
          if (absl::Status s = Build(child, cur, next, rule, loop, inline_depth); !s.ok()) return s;
          if (next != to) mandatory.Copy(raw_, begin, raw_.size(), e.min - 1 - i);
          cur = next;
        }
        if (e.max == e.min) return absl::OkStatus();
        if (e.max == kUnbounded) {
          int32_t head = New(rule), tail = New(rule);
          if (head < 0 || tail < 0) return TooLarge();
          raw_[cur].eps.push_back(head);
          if (absl::Status s = Build(child, head, tail, rule, true, inline_depth); !s.ok()) {
            return s;
          }
          raw_[tail].eps.push_back(head);
          raw_[head].eps.push_back(to);
          return absl::OkStatus();
        }
        // Nested optional copies: after k copies exactly one position is live.
        CopyAliaser optional_copies{reach};
        const uint32_t optional = e.max - e.min;
        for (uint32_t j = 0; j < optional; ++j) {
          raw_[cur].eps.push_back(to);
          const size_t begin = raw_.size();
          int32_t next = j + 1 == optional ? to : New(rule);
          if (next < 0) return TooLarge();
          if (absl::Status s = Build(child, cur, next, rule, loop, inline_depth); !s.ok()) return s;
          if (next != to) optional_copies.Copy(raw_, begin, raw_.size(), optional - 1 - j);
          cur = next;
        }
        return absl::OkStatus();
      }
    }
    return absl::InternalError("unknown grammar expression");
  }

  // Folds epsilon edges: each frame node gets the edges of its closure.
  absl::Status Expand() {
    const size_t n = raw_.size();
    std::vector<bool> frame(n, false);
    for (int32_t s : pda_.rule_start) frame[s] = true;
    for (const RawNode& r : raw_) {
      for (const auto& e : r.bytes) frame[e.target] = true;
      for (const auto& e : r.tokens) frame[e.target] = true;
      for (const auto& c : r.calls) frame[c.second] = true;
    }
    pda_.nodes.resize(n);
    std::vector<uint32_t> mark(n, 0);
    uint32_t epoch = 0;
    std::vector<int32_t> stack;
    int64_t work = 0;
    std::vector<Pda::ByteEdge> bytes;
    std::vector<std::pair<int32_t, int32_t>> calls;
    std::vector<std::pair<int32_t, int32_t>> tokens;
    for (size_t i = 0; i < n; ++i) {
      Pda::Node& out = pda_.nodes[i];
      out.rule = raw_[i].rule;
      out.mask_alias = raw_[i].alias;
      out.frame = frame[i];
      out.byte_begin = out.byte_end = static_cast<uint32_t>(pda_.byte_edges.size());
      out.call_begin = out.call_end = static_cast<uint32_t>(pda_.calls.size());
      out.token_begin = out.token_end = static_cast<uint32_t>(pda_.token_edges.size());
      if (!frame[i]) continue;
      ++epoch;
      bytes.clear();
      calls.clear();
      tokens.clear();
      stack.assign(1, static_cast<int32_t>(i));
      mark[i] = epoch;
      while (!stack.empty()) {
        const RawNode& r = raw_[stack.back()];
        stack.pop_back();
        if (++work > kMaxClosureWork) {
          return absl::InvalidArgumentError("grammar too large: epsilon closures too big");
        }
        out.final = out.final || r.final;
        bytes.insert(bytes.end(), r.bytes.begin(), r.bytes.end());
        calls.insert(calls.end(), r.calls.begin(), r.calls.end());
        for (const auto& t : r.tokens) tokens.emplace_back(t.token, t.target);
        for (int32_t e : r.eps) {
          if (mark[e] != epoch) {
            mark[e] = epoch;
            stack.push_back(e);
          }
        }
      }
      std::sort(bytes.begin(), bytes.end(), [](const auto& a, const auto& b) {
        return std::tie(a.lo, a.hi, a.target) < std::tie(b.lo, b.hi, b.target);
      });
      bytes.erase(std::unique(bytes.begin(), bytes.end(),
                              [](const auto& a, const auto& b) {
                                return a.lo == b.lo && a.hi == b.hi && a.target == b.target;
                              }),
                  bytes.end());
      std::sort(calls.begin(), calls.end());
      calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
      std::sort(tokens.begin(), tokens.end());
      tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
      pda_.byte_edges.insert(pda_.byte_edges.end(), bytes.begin(), bytes.end());
      for (auto [rule, ret] : calls) pda_.calls.push_back({rule, ret, false});
      for (auto [tok, target] : tokens) pda_.token_edges.push_back({tok, target});
      out.byte_end = static_cast<uint32_t>(pda_.byte_edges.size());
      out.call_end = static_cast<uint32_t>(pda_.calls.size());
      out.token_end = static_cast<uint32_t>(pda_.token_edges.size());
    }
    for (Pda::CallEdge& c : pda_.calls) {
      const Pda::Node& r = pda_.nodes[c.ret];
      c.tail = r.final && !r.HasInput() && r.call_begin == r.call_end;
    }
    return absl::OkStatus();
  }

  void Nullable() {
    const size_t n = pda_.nodes.size();
    nullable_node_.assign(n, false);
    nullable_rule_.assign(pda_.rule_start.size(), false);
    for (int pass = 0; pass < kMaxFixpointPasses; ++pass) {
      bool changed = false;
      for (size_t i = 0; i < n; ++i) {
        const Pda::Node& nd = pda_.nodes[i];
        if (!nd.frame || nullable_node_[i]) continue;
        bool v = nd.final;
        for (uint32_t k = nd.call_begin; k < nd.call_end && !v; ++k) {
          const Pda::CallEdge& c = pda_.calls[k];
          v = nullable_rule_[c.rule] && nullable_node_[c.ret];
        }
        if (v) {
          nullable_node_[i] = true;
          changed = true;
        }
      }
      for (size_t r = 0; r < nullable_rule_.size(); ++r) {
        nullable_rule_[r] = nullable_node_[pda_.rule_start[r]];
      }
      if (!changed) break;
    }
  }

  // Rule S left-calls R when S's start reaches a call of R through nullable calls only.
  absl::Status CheckLeftRecursion() {
    const size_t nrules = pda_.rule_start.size();
    std::vector<std::vector<int32_t>> left(nrules);
    std::vector<uint32_t> mark(pda_.nodes.size(), 0);
    std::vector<int32_t> stack;
    for (size_t s = 0; s < nrules; ++s) {
      const uint32_t epoch = static_cast<uint32_t>(s + 1);
      stack.assign(1, pda_.rule_start[s]);
      mark[pda_.rule_start[s]] = epoch;
      while (!stack.empty()) {
        const Pda::Node& nd = pda_.nodes[stack.back()];
        stack.pop_back();
        for (uint32_t k = nd.call_begin; k < nd.call_end; ++k) {
          const Pda::CallEdge& c = pda_.calls[k];
          left[s].push_back(c.rule);
          if (nullable_rule_[c.rule] && mark[c.ret] != epoch) {
            mark[c.ret] = epoch;
            stack.push_back(c.ret);
          }
        }
      }
    }
    std::vector<int32_t> pending(nrules, 0);
    std::vector<std::vector<int32_t>> callers(nrules);
    for (size_t s = 0; s < nrules; ++s) {
      for (int32_t r : left[s]) {
        ++pending[s];
        callers[r].push_back(static_cast<int32_t>(s));
      }
    }
    std::vector<int32_t> ready;
    std::vector<bool> done(nrules, false);
    for (size_t s = 0; s < nrules; ++s) {
      if (pending[s] == 0) ready.push_back(static_cast<int32_t>(s));
    }
    while (!ready.empty()) {
      int32_t r = ready.back();
      ready.pop_back();
      done[r] = true;
      for (int32_t c : callers[r]) {
        if (--pending[c] == 0) ready.push_back(c);
      }
    }
    for (size_t s = 0; s < nrules; ++s) {
      if (done[s]) continue;
      // Walk left calls among the rules left over until one repeats: it lies on a cycle.
      std::vector<bool> visited(nrules, false);
      int32_t r = static_cast<int32_t>(s);
      while (!visited[r]) {
        visited[r] = true;
        for (int32_t next : left[r]) {
          if (!done[next]) {
            r = next;
            break;
          }
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("left recursion in rule '", pda_.rule_names[r],
                       "' (it can reach itself without consuming input); rewrite it with "
                       "repetition, e.g. `a ::= b (\"x\" b)*`"));
    }
    return absl::OkStatus();
  }

  void Follow() {
    const size_t n = pda_.nodes.size();
    const size_t nrules = pda_.rule_start.size();
    std::vector<ByteSet> first(n, ByteSet{});
    std::vector<ByteSet> first_rule(nrules, ByteSet{});
    pda_.follow.assign(nrules, ByteSet{});
    auto unite = [](ByteSet& a, const ByteSet& b) {
      bool changed = false;
      for (int w = 0; w < 4; ++w) {
        uint64_t v = a[w] | b[w];
        changed |= v != a[w];
        a[w] = v;
      }
      return changed;
    };
    for (size_t i = 0; i < n; ++i) {
      const Pda::Node& nd = pda_.nodes[i];
      for (uint32_t k = nd.byte_begin; k < nd.byte_end; ++k) {
        for (int b = pda_.byte_edges[k].lo; b <= pda_.byte_edges[k].hi; ++b) {
          first[i][b >> 6] |= uint64_t{1} << (b & 63);
        }
      }
    }
    bool converged = false;
    for (int pass = 0; pass < kMaxFixpointPasses && !converged; ++pass) {
      bool changed = false;
      for (size_t i = 0; i < n; ++i) {
        const Pda::Node& nd = pda_.nodes[i];
        for (uint32_t k = nd.call_begin; k < nd.call_end; ++k) {
          const Pda::CallEdge& c = pda_.calls[k];
          changed |= unite(first[i], first_rule[c.rule]);
          if (nullable_rule_[c.rule]) changed |= unite(first[i], first[c.ret]);
          changed |= unite(pda_.follow[c.rule], first[c.ret]);
          if (nullable_node_[c.ret]) changed |= unite(pda_.follow[c.rule], pda_.follow[nd.rule]);
        }
      }
      for (size_t r = 0; r < nrules; ++r) {
        changed |= unite(first_rule[r], first[pda_.rule_start[r]]);
      }
      converged = !changed;
    }
    if (!converged) {
      for (ByteSet& f : pda_.follow) f.fill(~uint64_t{0});
    }
  }

  const Grammar& g_;
  const TokenVocab& v_;
  std::vector<RawNode> raw_;
  std::vector<int64_t> weight_;
  std::vector<int64_t> min_bytes_;
  int64_t max_token_bytes_ = 1;
  std::vector<bool> nonrec_;
  std::vector<bool> nullable_node_;
  std::vector<bool> nullable_rule_;
  absl::flat_hash_map<std::string, int32_t> added_;
  Pda pda_;
};

}  // namespace

absl::StatusOr<Pda> BuildPda(const Grammar& g, const TokenVocab& vocab) {
  return Builder(g, vocab).Run();
}

}  // namespace ss::grammar
