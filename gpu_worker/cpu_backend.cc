#include "gpu_worker/cpu_backend.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_worker/step_progress.h"

namespace ss::gpu {
namespace {

// Bytes of the checkpoint tensors this stage keeps: its blocks (routed experts only where they
// are local), the embedding on stage 0, the head and final norm on the last stage.
int64_t StageWeightBytes(const model::Model& m, const CpuBackendOptions& o,
                         const RoutedExpertsClient* experts) {
  int64_t bytes = 0;
  const bool last = o.stage == o.num_stages - 1;
  for (const auto& [name, t] : m.weights().checkpoint->tensors()) {
    bool keep = false;
    if (absl::StartsWith(name, "layers.")) {
      const size_t dot = name.find('.', 7);
      int layer = -1;
      if (dot != std::string::npos && absl::SimpleAtoi(name.substr(7, dot - 7), &layer)) {
        keep = layer >= o.first_layer && layer < o.end_layer &&
               !(experts->remote(layer) && absl::StrContains(name, ".ffn.experts."));
      }
    } else if (absl::StartsWith(name, "embed.")) {
      keep = o.stage == 0;
    } else if (!absl::StartsWith(name, "mtp.")) {
      keep = last;  // head, norm, hc_head_*
    }
    if (keep) bytes += static_cast<int64_t>(t->nbytes);
  }
  return bytes;
}

}  // namespace

CpuBackend::CpuBackend(std::shared_ptr<const model::Model> model, const CpuBackendOptions& options)
    : model_(std::move(model)), options_(options) {}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    std::shared_ptr<const model::Model> model, const CpuBackendOptions& o) {
  const ModelConfig& c = model->config();
  RETURN_IF_ERROR(
      CheckStageLayout(c, o.stage, o.num_stages, o.first_layer, o.end_layer, o.kv_tokens));
  std::unique_ptr<CpuBackend> b(new CpuBackend(std::move(model), o));
  ASSIGN_OR_RETURN(b->experts_,
                   RoutedExpertsClient::Connect(*b->model_, o.experts, o.expert_client));
  b->info_.device = "cpu";
  b->info_.kv_tokens = o.kv_tokens;
  b->info_.weight_bytes = StageWeightBytes(*b->model_, o, b->experts_.get());
  int64_t per_token = 0;  // fp32 compressed KV + indexer keys, amortised per token
  for (int l = o.first_layer; l < o.end_layer; ++l) {
    const int64_t ratio = c.compress_ratio(l);
    if (ratio > 0) per_token += c.head_dim * 4 / ratio;
    if (ratio == 4) per_token += c.index_head_dim * 4 / ratio;
  }
  b->info_.kv_bytes = per_token * o.kv_tokens;
  return b;
}

KvUsage CpuBackend::kv_usage() const {
  KvUsage u;
  u.capacity_tokens = options_.kv_tokens;
  u.sequences = static_cast<int64_t>(sequences_.size());
  for (const auto& [id, s] : sequences_) u.used_tokens += s.next_pos;
  for (const auto& [id, start] : resumed_) u.used_tokens -= start;
  return u;
}

absl::Status CpuBackend::SaveSnapshot(uint64_t seq_id, int64_t position, uint64_t snapshot_id,
                                      std::span<const int32_t> blocks) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second.next_pos != position || position <= 0 ||
      blocks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot snapshot sequence ", seq_id, " at ", position, " into ", blocks.size(),
        " blocks: ", it == sequences_.end() ? "unknown sequence" : "not its next position"));
  }
  snapshots_[snapshot_id] = it->second;
  return absl::OkStatus();
}

absl::Status CpuBackend::Check(std::span<const StageChunk> batch) const {
  for (const StageChunk& ch : batch) {
    if (ch.restore_snapshot.empty()) continue;
    auto it = snapshots_.find(ch.restore_snapshot_id);
    if (it == snapshots_.end() || it->second.next_pos != ch.start) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", ch.seq_id,
                                                     ": no snapshot at position ", ch.start,
                                                     " named ", ch.restore_snapshot_id));
    }
  }
  return CheckBatch(model_->config(), batch, kv_usage().used_tokens, options_.kv_tokens,
                    [&](uint64_t id) -> int64_t {
                      auto it = sequences_.find(id);
                      return it == sequences_.end() ? -1 : it->second.next_pos;
                    });
}

absl::Status CpuBackend::Run(std::span<const StageChunk> batch, const float* streams_in,
                             StageOutput* out, StageTimings* timings) {
  RETURN_IF_ERROR(Check(batch));
  const ModelConfig& c = model_->config();
  const int64_t width = c.hc_mult * c.dim;
  const bool first = options_.stage == 0, last = options_.stage == options_.num_stages - 1;
  if (!first && streams_in == nullptr) {
    return absl::InvalidArgumentError("stage > 0 needs the previous stage's streams");
  }
  // Sequences that begin here get fresh states, installed only when the stage succeeds.
  std::map<uint64_t, model::SequenceState> fresh;
  std::vector<std::vector<int64_t>> ids(batch.size());
  std::vector<model::ChunkRef> refs(batch.size());
  int64_t T = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const StageChunk& ch = batch[i];
    ids[i].assign(ch.tokens.begin(), ch.tokens.end());
    model::SequenceState* state = !ch.restore_snapshot.empty()
                                      ? &(fresh[ch.seq_id] = snapshots_.at(ch.restore_snapshot_id))
                                  : ch.start == 0 ? &(fresh[ch.seq_id] = model_->NewSequence())
                                                  : &sequences_.at(ch.seq_id);
    refs[i] = {state, ids[i].data(), static_cast<int64_t>(ids[i].size()), ch.start};
    T += refs[i].n;
  }
  std::vector<float> h(T * width), h2(T * width);
  if (first) {
    int64_t row = 0;
    for (const model::ChunkRef& r : refs) {
      model_->EmbedStreams(r.tokens, r.n, h.data() + row * width);
      row += r.n;
    }
  } else {
    std::copy_n(streams_in, T * width, h.data());
  }
  const int n_layers = options_.end_layer - options_.first_layer;
  const bool per_layer = timings != nullptr && timings->layers;
  if (per_layer) {
    for (auto* v :
         {&timings->attention, &timings->moe_gpu, &timings->moe_cpu, &timings->allreduce}) {
      v->assign(n_layers, 0.0);
    }
  }
  for (int l = options_.first_layer; l < options_.end_layer; ++l) {
    model::BlockTimings bt;
    const absl::Status st = model_->RunBlock(l, refs, h.data(), h2.data(),
                                             experts_->remote(l) ? experts_.get() : nullptr, &bt);
    if (!st.ok()) {
      // The batch's existing sequences took part of this step: drop them.
      for (const StageChunk& ch : batch) Release(ch.seq_id);
      return st;
    }
    if (per_layer) {
      const int i = l - options_.first_layer;
      timings->attention[i] = bt.attention;
      timings->moe_gpu[i] = bt.moe;
      timings->moe_cpu[i] = bt.moe_cpu;
    }
    h.swap(h2);
    NoteStepProgress();
  }
  out->rows = T;
  out->width = width;
  out->streams.clear();
  out->logits.clear();
  out->tokens.clear();
  if (last) {
    std::vector<const float*> last;  // the sampled chunks' last rows, logits in one pass
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      row += refs[i].n;
      if (batch[i].samples) last.push_back(h.data() + (row - 1) * width);
    }
    out->logits = model_->LogitsRows(last);
  } else {
    out->streams = std::move(h);
  }
  for (auto& [id, s] : fresh) sequences_[id] = std::move(s);
  for (const StageChunk& ch : batch) {
    if (!ch.restore_snapshot.empty()) {
      resumed_[ch.seq_id] = ch.start;
    } else if (ch.start == 0) {
      resumed_.erase(ch.seq_id);
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    sequences_.at(batch[i].seq_id).next_pos = batch[i].start + refs[i].n;
  }
  return absl::OkStatus();
}

}  // namespace ss::gpu
