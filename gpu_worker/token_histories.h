// The sampler's view of each penalised sequence's tokens (sampler.h TokenHistory), kept by the
// last stage from the chunks its plans carry, so that the coordinator never resends a
// conversation: a chunk at position 0 starts a sequence's history over, every later chunk must
// continue it exactly, and positions from the sequence's prompt length on count as output.
// Only sequences whose sampling parameters set a penalty are tracked.
//
// Threads: one at a time (the stage runner's).
#pragma once

#include <cstdint>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "gpu_worker/sampler.h"

namespace ss::gpu {

class TokenHistories {
 public:
  // Adds the tokens at positions [start, start + tokens.size()) of sequence `seq_id`, whose
  // prompt is `prompt_tokens` long. FailedPrecondition naming the sequence when start > 0 does
  // not continue what is held (the earlier chunks were not seen); nothing changes then.
  absl::Status Observe(uint64_t seq_id, int64_t start, std::span<const int32_t> tokens,
                       int64_t prompt_tokens);
  // The history Observe built, or null.
  const TokenHistory* Find(uint64_t seq_id) const;
  void Release(uint64_t seq_id) { seqs_.erase(seq_id); }
  void Clear() { seqs_.clear(); }
  size_t size() const { return seqs_.size(); }

 private:
  struct Seq {
    TokenHistory history;
    int64_t next = 0;  // the position the next chunk must start at
  };
  absl::flat_hash_map<uint64_t, Seq> seqs_;
};

}  // namespace ss::gpu
