#include "coordinator/kv_accounting.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ss::sched {

absl::StatusOr<KvAccounting> KvAccounting::Create(const KvCostModel& cost, int64_t total_blocks,
                                                  bool prefix_caching) {
  if (cost.block_tokens <= 0 || cost.fixed_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV accounting: invalid cost model ", cost.DebugString()));
  }
  if (total_blocks <= 0 || total_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV accounting: total_blocks = ", total_blocks, " must be in [1, 2^31 - 1]"));
  }
  if (prefix_caching && cost.snapshot_blocks < cost.fixed_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV accounting: prefix caching needs the snapshot size, ", cost.DebugString()));
  }
  return KvAccounting(cost, total_blocks, prefix_caching);
}

KvAccounting::KvAccounting(const KvCostModel& cost, int64_t total_blocks, bool prefix_caching)
    : cost_(cost), total_blocks_(total_blocks), prefix_caching_(prefix_caching) {
  free_.resize(static_cast<size_t>(total_blocks));
  // Block 0 on top, so a fresh pool hands out 0, 1, 2, ...
  for (int64_t i = 0; i < total_blocks; ++i) {
    free_[static_cast<size_t>(i)] = static_cast<int32_t>(total_blocks - 1 - i);
  }
}

int64_t KvAccounting::BlocksHeld(KvSequenceId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
}

uint64_t KvAccounting::ChildKey(uint64_t parent, std::span<const int32_t> tokens) {
  return absl::HashOf(parent, absl::MakeConstSpan(tokens.data(), tokens.size()));
}

int32_t KvAccounting::TakeBlock() {
  if (free_.empty()) EvictOne();
  const int32_t b = free_.back();
  free_.pop_back();
  return b;
}

void KvAccounting::EvictOne() {
  assert(!lru_.empty());
  const auto [is_snapshot, key] = lru_.front();
  lru_.pop_front();
  if (is_snapshot) {
    DropSnapshot(key);
    if (nodes_.at(key).block < 0) nodes_.erase(key);
    return;
  }
  const int32_t block = static_cast<int32_t>(key);
  block_lru_.erase(block);
  auto it = cached_.find(block);
  const Cached& c = it->second;
  children_.erase(c.hash);
  Node& n = nodes_.at(c.node);
  if (n.has_snapshot) {  // unreachable from now on (only Admit pins one, and not across calls)
    lru_.erase(n.snapshot_lru);
    DropSnapshot(c.node);
  }
  nodes_.erase(c.node);
  cached_.erase(it);
  --evictable_;
  --cached_blocks_;
  free_.push_back(block);
}

void KvAccounting::DropSnapshot(uint64_t node) {
  Node& n = nodes_.at(node);
  free_.insert(free_.end(), n.snapshot.blocks.rbegin(), n.snapshot.blocks.rend());
  const int64_t k = static_cast<int64_t>(n.snapshot.blocks.size());
  evictable_ -= k;
  cached_blocks_ -= k;
  evicted_snapshots_.push_back(n.snapshot.id);
  n.has_snapshot = false;
  n.snapshot = {};
}

KvGrow KvAccounting::Grow(KvSequenceId seq, int64_t tokens) {
  const int64_t need = cost_.BlocksForTokens(tokens) - BlocksHeld(seq);
  if (need <= 0) return KvGrow::kOk;
  if (need > free_blocks()) return KvGrow::kOutOfBlocks;
  Table& table = tables_[seq];
  for (int64_t i = 0; i < need; ++i) table.blocks.push_back(TakeBlock());
  return KvGrow::kOk;
}

void KvAccounting::Unref(int32_t block) {
  auto it = cached_.find(block);
  if (it == cached_.end()) {
    free_.push_back(block);
    return;
  }
  if (--it->second.refs > 0) return;
  lru_.emplace_back(false, static_cast<uint64_t>(block));
  block_lru_[block] = std::prev(lru_.end());
  ++evictable_;
}

void KvAccounting::Release(KvSequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  // Reverse order: a sequence re-created right away gets the same free blocks back, and its
  // cached tail is evicted before its head.
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) Unref(*b);
  tables_.erase(it);
}

std::span<const int32_t> KvAccounting::BlockTable(KvSequenceId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

const KvAccounting::Cached* KvAccounting::FindChild(uint64_t parent,
                                                    std::span<const int32_t> tokens) const {
  auto it = children_.find(ChildKey(parent, tokens));
  if (it == children_.end()) return nullptr;
  const Cached& c = cached_.at(it->second);
  if (c.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), c.tokens.begin(), c.tokens.end()))
    return nullptr;
  return &c;
}

PrefixHit KvAccounting::Lookup(std::span<const int32_t> tokens, int64_t max_tokens) const {
  PrefixHit hit;
  if (!prefix_caching_) return hit;
  const int64_t B = cost_.block_tokens;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  uint64_t parent = 0;
  std::vector<int32_t> path;
  for (int64_t end = B; end <= limit; end += B) {
    const Cached* c =
        FindChild(parent, tokens.subspan(static_cast<size_t>(end - B), static_cast<size_t>(B)));
    if (c == nullptr) break;
    path.push_back(static_cast<int32_t>(nodes_.at(c->node).block));
    parent = c->node;
    if (nodes_.at(c->node).has_snapshot) {
      hit.tokens = end;
      hit.blocks = path;
      hit.node = c->node;
    }
  }
  return hit;
}

int64_t KvAccounting::TokensReachableWith(const PrefixHit& hit, int64_t reserve) const {
  // The hit's blocks and snapshot stop being evictable once admitted.
  int64_t free = free_blocks() - reserve;
  for (const int32_t b : hit.blocks) free -= block_lru_.contains(b) ? 1 : 0;
  if (hit.tokens > 0) {
    const Node& n = nodes_.at(hit.node);
    if (n.snapshot_pins == 0) free -= static_cast<int64_t>(n.snapshot.blocks.size());
  }
  const int64_t own = cost_.TokensInBlocks(std::max<int64_t>(free, 0));
  return own == 0 ? 0 : own + hit.tokens;
}

void KvAccounting::PinSnapshot(uint64_t node) {
  Node& n = nodes_.at(node);
  if (n.snapshot_pins++ > 0) return;
  lru_.erase(n.snapshot_lru);
  evictable_ -= static_cast<int64_t>(n.snapshot.blocks.size());
}

void KvAccounting::UnpinSnapshot(uint64_t node) {
  Node& n = nodes_.at(node);
  if (--n.snapshot_pins > 0) return;
  lru_.emplace_back(true, node);
  n.snapshot_lru = std::prev(lru_.end());
  evictable_ += static_cast<int64_t>(n.snapshot.blocks.size());
}

KvGrow KvAccounting::Admit(KvSequenceId seq, const PrefixHit& hit, int64_t tokens,
                           SnapshotTicket* restore) {
  *restore = {};
  assert(!tables_.contains(seq) && tokens > hit.tokens);
  if (TokensReachableWith(hit, 0) < tokens) return KvGrow::kOutOfBlocks;
  Table& table = tables_[seq];
  if (hit.tokens > 0) {
    PinSnapshot(hit.node);  // not evicted by the allocations below
    for (const int32_t b : hit.blocks) {
      Cached& c = cached_.at(b);
      if (c.refs++ == 0) {
        lru_.erase(block_lru_.at(b));
        block_lru_.erase(b);
        --evictable_;
      }
    }
  }
  for (int64_t i = 0; i < cost_.fixed_blocks; ++i) table.blocks.push_back(TakeBlock());
  table.blocks.insert(table.blocks.end(), hit.blocks.begin(), hit.blocks.end());
  const int64_t own = cost_.BlocksForTokens(tokens) - static_cast<int64_t>(table.blocks.size());
  for (int64_t i = 0; i < own; ++i) table.blocks.push_back(TakeBlock());
  if (hit.tokens > 0) {
    for (const int32_t b : hit.blocks) table.nodes.push_back(cached_.at(b).node);
    const Snapshot& snap = nodes_.at(hit.node).snapshot;
    *restore = {snap.id, snap.blocks};
    UnpinSnapshot(hit.node);
  }
  return KvGrow::kOk;
}

void KvAccounting::Register(KvSequenceId seq, std::span<const int32_t> tokens) {
  if (!prefix_caching_) return;
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const int64_t B = cost_.block_tokens;
  const int64_t full = std::min<int64_t>(static_cast<int64_t>(tokens.size()) / B,
                                         BlocksHeld(seq) - cost_.fixed_blocks);
  for (int64_t i = static_cast<int64_t>(t.nodes.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : t.nodes[static_cast<size_t>(i - 1)];
    if (parent != 0 && !nodes_.contains(parent)) return;  // its path was evicted
    const std::span<const int32_t> span =
        tokens.subspan(static_cast<size_t>(i * B), static_cast<size_t>(B));
    if (const Cached* twin = FindChild(parent, span); twin != nullptr) {
      t.nodes.push_back(twin->node);
      continue;
    }
    const int32_t block = t.blocks[static_cast<size_t>(cost_.fixed_blocks + i)];
    if (cached_.contains(block)) return;  // cached under another path: not ours to re-key
    const uint64_t hash = ChildKey(parent, span);
    if (children_.contains(hash)) return;  // a colliding key: leave it private
    const uint64_t node = next_node_++;
    cached_[block] = Cached{node, parent, hash, std::vector<int32_t>(span.begin(), span.end()), 1};
    nodes_[node].block = block;
    children_[hash] = block;
    ++cached_blocks_;
    t.nodes.push_back(node);
  }
}

bool KvAccounting::BeginSnapshot(KvSequenceId seq, int64_t position, int64_t reserve,
                                 SnapshotTicket* ticket) {
  const int64_t B = cost_.block_tokens;
  if (!prefix_caching_ || position <= 0 || position % B != 0 || !tables_.contains(seq)) {
    return false;
  }
  if (free_blocks() < cost_.snapshot_blocks + reserve) return false;
  const Table& t = tables_.at(seq);
  const size_t k = static_cast<size_t>(position / B);
  if (t.nodes.size() >= k) {
    auto n = nodes_.find(t.nodes[k - 1]);
    if (n != nodes_.end() && n->second.has_snapshot) return false;
  }
  ticket->id = next_snapshot_++;
  ticket->blocks.clear();
  for (int64_t i = 0; i < cost_.snapshot_blocks; ++i) ticket->blocks.push_back(TakeBlock());
  return true;
}

void KvAccounting::CommitSnapshot(KvSequenceId seq, int64_t position,
                                  const SnapshotTicket& ticket) {
  const size_t k = static_cast<size_t>(position / cost_.block_tokens);
  auto t = tables_.find(seq);
  Node* n = nullptr;
  if (t != tables_.end() && t->second.nodes.size() >= k) {
    auto it = nodes_.find(t->second.nodes[k - 1]);
    if (it != nodes_.end() && it->second.block >= 0 && !it->second.has_snapshot) n = &it->second;
  }
  if (n == nullptr) {
    AbortSnapshot(ticket);
    return;
  }
  n->has_snapshot = true;
  n->snapshot = {ticket.id, ticket.blocks};
  n->snapshot_pins = 0;
  lru_.emplace_back(true, t->second.nodes[k - 1]);
  n->snapshot_lru = std::prev(lru_.end());
  const int64_t size = static_cast<int64_t>(ticket.blocks.size());
  evictable_ += size;
  cached_blocks_ += size;
}

void KvAccounting::AbortSnapshot(const SnapshotTicket& ticket) {
  free_.insert(free_.end(), ticket.blocks.rbegin(), ticket.blocks.rend());
  evicted_snapshots_.push_back(ticket.id);  // the workers may have saved it
}

std::vector<uint64_t> KvAccounting::TakeEvictedSnapshots() {
  std::vector<uint64_t> out;
  out.swap(evicted_snapshots_);
  return out;
}

}  // namespace ss::sched
