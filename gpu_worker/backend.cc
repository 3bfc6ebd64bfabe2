#include "gpu_worker/backend.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace ss::gpu {

absl::Status CheckStageLayout(const ModelConfig& c, int stage, int num_stages, int64_t first_layer,
                              int64_t end_layer, int64_t kv_tokens) {
  if (num_stages < 1 || stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage, " of ", num_stages, " stages"));
  }
  if (first_layer < 0 || end_layer > c.n_layers || first_layer >= end_layer) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", first_layer, ", ", end_layer,
                                                   ") are not a range of the model's ", c.n_layers,
                                                   " layers"));
  }
  if (stage == 0 && first_layer != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage 0 must start at layer 0, not ", first_layer));
  }
  if (stage == num_stages - 1 && end_layer != c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the last stage must end at layer ", c.n_layers, ", not ", end_layer));
  }
  if (kv_tokens < 1)
    return absl::InvalidArgumentError(absl::StrCat("kv_tokens ", kv_tokens, " < 1"));
  return absl::OkStatus();
}

absl::Status CheckBatch(const ModelConfig& c, std::span<const StageChunk> batch,
                        int64_t used_tokens, int64_t capacity_tokens,
                        absl::FunctionRef<int64_t(uint64_t)> next_pos) {
  std::set<uint64_t> seen;
  int64_t used = used_tokens;
  for (const StageChunk& ch : batch) {
    const std::string seq = absl::StrCat("sequence ", ch.seq_id);
    if (!seen.insert(ch.seq_id).second) {
      return absl::InvalidArgumentError(absl::StrCat(seq, " appears twice in the micro-batch"));
    }
    if (ch.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(seq, ": no tokens"));
    for (const int32_t t : ch.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(seq, ": token id ", t, " outside [0, ", c.vocab_size, ")"));
      }
    }
    const int64_t pos = next_pos(ch.seq_id);
    int64_t held = pos < 0 ? 0 : pos;
    if (!ch.restore_snapshot.empty()) {
      if (pos >= 0 || ch.start <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(seq, ": a chunk resuming from a snapshot must start past 0 (it starts at ",
                         ch.start, ") for a sequence this worker does not hold (",
                         pos < 0 ? "it does not" : "it does", ")"));
      }
      held = ch.start;  // the shared blocks below start are the cache's, not this sequence's
    } else if (ch.start != 0) {
      if (pos < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(seq, ": chunk starts at ", ch.start,
                         " but this worker holds no state for it (unknown, released or failed)"));
      }
      if (ch.start != held) {
        return absl::InvalidArgumentError(absl::StrCat(seq, ": chunk starts at ", ch.start,
                                                       ", the sequence's next position is ", held));
      }
    }
    const int64_t end = ch.start + static_cast<int64_t>(ch.tokens.size());
    if (c.max_position_embeddings > 0 && end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(seq, ": positions up to ", end,
                                                     " exceed the model's context of ",
                                                     c.max_position_embeddings));
    }
    used += end - held;
  }
  if (used > capacity_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat("KV capacity exceeded: the micro-batch needs ",
                                                     used, " tokens, this worker holds ",
                                                     capacity_tokens));
  }
  return absl::OkStatus();
}

}  // namespace ss::gpu
