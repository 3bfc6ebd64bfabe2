#include "gpu_worker/token_histories.h"

#include "absl/strings/str_cat.h"

namespace ss::gpu {

absl::Status TokenHistories::Observe(uint64_t seq_id, int64_t start,
                                     std::span<const int32_t> tokens, int64_t prompt_tokens) {
  if (start == 0) seqs_.erase(seq_id);
  auto it = seqs_.find(seq_id);
  const int64_t expected = it == seqs_.end() ? 0 : it->second.next;
  if (start != expected) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq_id, ": the penalties need its tokens from position 0; got a ",
                     "chunk at ", start, ", expected ", expected));
  }
  Seq& s = seqs_[seq_id];
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (start + static_cast<int64_t>(i) < prompt_tokens) {
      s.history.prompt.insert(tokens[i]);
    } else {
      ++s.history.output[tokens[i]];
    }
  }
  s.next = start + static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

const TokenHistory* TokenHistories::Find(uint64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : &it->second.history;
}

}  // namespace ss::gpu
