#include "gpu_worker/routed_experts_client.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bf16.h"
#include "common/model/moe.h"
#include "common/status.h"
#include "cpu_expert_worker/transport/grpc_client.h"
#include "cpu_expert_worker/transport/shm_client.h"
#include "gpu_worker/step_progress.h"
#include "spdlog/spdlog.h"

namespace ss::gpu {

namespace shm = ::ss::expert::shm;
namespace grpc_transport = ::ss::expert::grpc_transport;

std::string ExpertEndpointConfig::Describe() const {
  std::string s =
      shm_name.empty() ? absl::StrCat("grpc:", grpc_address) : absl::StrCat("shm:", shm_name);
  if (!worker_id.empty()) absl::StrAppend(&s, " (worker ", worker_id, ")");
  return s;
}

absl::Status ValidateLayerExperts(const LayerExpertsConfig& l, int tp_rank, int tp_size) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", l.layer, ": TP rank ", tp_rank, " of ", tp_size));
  }
  if (l.slice_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", l.layer, ": slice count ", l.slice_count, " < 0"));
  }
  if (l.endpoints.empty()) {
    if (l.slice_count > tp_rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l.layer, ": no endpoint for TP rank ", tp_rank, " of ", tp_size,
                       ", whose slices of the layer's ", l.slice_count, " start at ", tp_rank));
    }
    return absl::OkStatus();
  }
  const int n = l.slice_count > 0 ? l.slice_count : l.endpoints.front().slice_count;
  std::set<int> seen;
  for (const ExpertEndpointConfig& e : l.endpoints) {
    const std::string where = absl::StrCat("layer ", l.layer, ", expert endpoint ", e.Describe());
    if (e.shm_name.empty() == e.grpc_address.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": exactly one of shm_name / grpc_address must be set"));
    }
    if (e.slice_count != n || e.slice_index < 0 || e.slice_index >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": slice ", e.slice_index, "/", e.slice_count, " in a layer of ", n, " slices"));
    }
    if (e.slice_index % tp_size != tp_rank) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": slice ", e.slice_index,
                                                     " belongs to TP rank ",
                                                     e.slice_index % tp_size, ", not ", tp_rank));
    }
    if (!seen.insert(e.slice_index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": slice ", e.slice_index, " is served twice"));
    }
  }
  const int want = n > tp_rank ? (n - tp_rank + tp_size - 1) / tp_size : 0;
  if (static_cast<int>(seen.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", l.layer, ": ", seen.size(), " endpoints for ", want, " slices of ", n,
        tp_size > 1 ? absl::StrCat(" (TP rank ", tp_rank, " of ", tp_size, ")") : std::string()));
  }
  return absl::OkStatus();
}

std::vector<LayerExpertsConfig> ExpertSlicesForRank(const std::vector<LayerExpertsConfig>& layers,
                                                    int tp_rank, int tp_size) {
  std::vector<LayerExpertsConfig> out;
  for (const LayerExpertsConfig& l : layers) {
    if (l.endpoints.empty()) {
      out.push_back(l);
      continue;
    }
    LayerExpertsConfig mine;
    mine.layer = l.layer;
    mine.slice_count = l.slice_count > 0 ? l.slice_count : l.endpoints.front().slice_count;
    for (const ExpertEndpointConfig& e : l.endpoints) {
      if (tp_size > 0 && e.slice_index % tp_size == tp_rank) mine.endpoints.push_back(e);
    }
    std::sort(mine.endpoints.begin(), mine.endpoints.end(),
              [](const auto& a, const auto& b) { return a.slice_index < b.slice_index; });
    out.push_back(std::move(mine));
  }
  return out;
}

// One connected expert worker.
class RoutedExpertsClient::Endpoint {
 public:
  std::string label;
  int64_t max_tokens = 0;
  std::unique_ptr<shm::ShmClient> shm;
  std::unique_ptr<grpc_transport::GrpcExpertClient> grpc;

  absl::Status Call(const shm::ExpertCallInput& in, float* out, absl::Time deadline) const {
    return shm ? shm->Call(in, out, deadline) : grpc->Call(in, out, deadline);
  }
};

namespace {

bool Retryable(const absl::Status& st) {
  return absl::IsNotFound(st) || absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st);
}

absl::StatusOr<std::unique_ptr<RoutedExpertsClient::Endpoint>> ConnectEndpoint(
    const ExpertEndpointConfig& e, const ModelConfig& c, const ExpertClientOptions& options) {
  const absl::Duration timeout = options.connect_timeout;
  const std::atomic<bool>* cancel = options.cancel;
  const ClusterCredential& credential = options.credential;
  auto ep = std::make_unique<RoutedExpertsClient::Endpoint>();
  ep->label = e.Describe();
  const absl::Time until = absl::Now() + timeout;
  absl::Status last;
  bool logged = false;
  while (true) {
    if (!e.shm_name.empty()) {
      shm::ShmClientOptions o;
      o.expect_dim = static_cast<uint32_t>(c.dim);
      o.expect_top_k = static_cast<uint32_t>(c.n_activated_experts);
      o.spin = options.shm_answer_spin;
      auto client = shm::ShmClient::Connect(e.shm_name, o);
      if (client.ok()) {
        ep->max_tokens = (*client)->layout().shape.max_tokens;
        ep->shm = std::move(*client);
        return ep;
      }
      last = client.status();
    } else {
      grpc_transport::GrpcClientOptions o;
      o.credential = credential;
      o.expect_dim = static_cast<uint32_t>(c.dim);
      o.expect_top_k = static_cast<uint32_t>(c.n_activated_experts);
      o.connect_timeout =
          std::min(absl::Seconds(5), std::max(absl::Milliseconds(100), until - absl::Now()));
      auto client = grpc_transport::GrpcExpertClient::Connect(e.grpc_address, o);
      if (client.ok()) {
        const grpc_transport::GrpcServerInfo& info = (*client)->info();
        if (info.slice_index != e.slice_index || info.slice_count != e.slice_count) {
          return absl::FailedPreconditionError(absl::StrCat(
              "expert endpoint ", ep->label, " serves slice ", info.slice_index, "/",
              info.slice_count, ", the role expects ", e.slice_index, "/", e.slice_count));
        }
        ep->max_tokens = info.max_tokens;
        ep->grpc = std::move(*client);
        return ep;
      }
      last = client.status();
    }
    if (!Retryable(last) || absl::Now() >= until) break;
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(absl::StrCat("expert endpoint ", ep->label, ": stopped"));
    }
    if (!logged) {
      spdlog::info("waiting for expert endpoint {}: {}", ep->label, std::string(last.message()));
      logged = true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::Status(last.code(),
                      absl::StrCat("expert endpoint ", ep->label, ": ", last.message()));
}

}  // namespace

RoutedExpertsClient::RoutedExpertsClient(const model::Model& model,
                                         const ExpertClientOptions& options)
    : model_(model), options_(options) {}

RoutedExpertsClient::~RoutedExpertsClient() = default;

absl::StatusOr<std::unique_ptr<RoutedExpertsClient>> RoutedExpertsClient::Connect(
    const model::Model& model, const std::vector<LayerExpertsConfig>& layers,
    const ExpertClientOptions& options) {
  const ModelConfig& c = model.config();
  std::unique_ptr<RoutedExpertsClient> client(new RoutedExpertsClient(model, options));
  for (const LayerExpertsConfig& l : layers) {
    if (l.layer < 0 || l.layer >= c.n_layers + c.n_mtp_layers) {
      return absl::InvalidArgumentError(absl::StrCat("expert layer ", l.layer, " outside [0, ",
                                                     c.n_layers + c.n_mtp_layers, ")"));
    }
    RETURN_IF_ERROR(ValidateLayerExperts(l, options.tp_rank, options.tp_size));
    if (l.endpoints.empty() && l.slice_count == 0) continue;
    if (client->layers_.count(l.layer)) {
      return absl::InvalidArgumentError(absl::StrCat("expert layer ", l.layer, " listed twice"));
    }
    Layer& dst = client->layers_[l.layer];
    if (l.endpoints.empty()) continue;  // none of its slices is this rank's: it adds zero
    std::vector<std::pair<int, const Endpoint*>> held;  // (slice, endpoint), then slice order
    for (const ExpertEndpointConfig& e : l.endpoints) {
      ExpertEndpointConfig key = e;
      key.worker_id.clear();
      auto it = client->endpoints_.find(key.Describe());
      if (it == client->endpoints_.end()) {
        auto ep = ConnectEndpoint(e, c, options);
        if (!ep.ok()) {
          return absl::Status(ep.status().code(),
                              absl::StrCat("layer ", l.layer, ": ", ep.status().message()));
        }
        it = client->endpoints_.emplace(key.Describe(), std::move(*ep)).first;
      }
      if (it->second->grpc) {
        const auto& held = it->second->grpc->info().layers;
        if (std::find(held.begin(), held.end(), l.layer) == held.end()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "layer ", l.layer, ": expert endpoint ", e.Describe(), " does not hold this layer"));
        }
      }
      held.emplace_back(e.slice_index, it->second.get());
    }
    std::sort(held.begin(), held.end());
    for (const auto& [slice, ep] : held) dst.slices.push_back(ep);
    dst.share = static_cast<double>(held.size()) /
                (l.slice_count > 0 ? l.slice_count : l.endpoints.front().slice_count);
    dst.max_tokens = dst.slices.front()->max_tokens;
    for (const Endpoint* ep : dst.slices) dst.max_tokens = std::min(dst.max_tokens, ep->max_tokens);
    if (dst.max_tokens < 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", l.layer, ": an expert endpoint accepts no tokens"));
    }
  }
  return client;
}

absl::Status RoutedExpertsClient::ComputeLocal(int64_t layer, int64_t T, const float* x,
                                               const int32_t* ids, const float* weights, int top_k,
                                               float* out) const {
  const ModelConfig& c = model_.config();
  if (top_k != c.n_activated_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", layer, ": top_k ", top_k, ", the model routes to ", c.n_activated_experts));
  }
  const model::ModelWeights& w = model_.weights();
  const model::MoeWeights& moe =
      layer < c.n_layers ? w.blocks[layer].moe : w.mtp[layer - c.n_layers].block.moe;
  model::RouterResult r;
  r.indices.assign(ids, ids + T * top_k);
  r.weights.assign(weights, weights + T * top_k);
  for (const int32_t e : r.indices) {
    if (e != model::kSkippedExpert && (e < 0 || e >= c.n_routed_experts)) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer, ": expert id ", e));
    }
  }
  model::RoutedSum(moe, c, x, r, T, out);
  NoteStepProgress();
  return absl::OkStatus();
}

void RoutedExpertsClient::CountCall(int64_t layer, const int32_t* ids, int64_t n,
                                    double share) const {
  if (options_.heat == nullptr) return;
  options_.heat->Count(layer, ids, n, ChoicePath::kCpu);
  const ModelConfig& c = model_.config();
  std::vector<bool> read(static_cast<size_t>(c.n_routed_experts), false);
  int64_t distinct = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < c.n_routed_experts && !read[ids[i]]) {
      read[ids[i]] = true;
      ++distinct;
    }
  }
  options_.heat->AddCpuRead(
      std::llround(static_cast<double>(distinct * model::Mxfp4ExpertBytes(c)) * share));
}

absl::Status RoutedExpertsClient::Compute(int64_t layer, int64_t T, const float* x,
                                          const int32_t* ids, const float* weights, int top_k,
                                          float* out) const {
  const ModelConfig& c = model_.config();
  if (layer < 0 || layer >= c.n_layers + c.n_mtp_layers) {
    return absl::InvalidArgumentError(absl::StrCat("expert call for layer ", layer));
  }
  if (T <= 0) return absl::OkStatus();
  auto it = layers_.find(layer);
  CountCall(layer, ids, T * top_k, it == layers_.end() ? 1.0 : it->second.share);
  if (it == layers_.end()) return ComputeLocal(layer, T, x, ids, weights, top_k, out);
  const Layer& l = it->second;
  const int64_t dim = c.dim;
  // Nothing to compute here: no slice of this rank, or every choice skipped (resident on the GPU).
  if (l.slices.empty() ||
      std::all_of(ids, ids + T * top_k, [](int32_t e) { return e == model::kSkippedExpert; })) {
    std::fill_n(out, T * dim, 0.0f);
    return absl::OkStatus();
  }
  std::vector<uint16_t> xb(T * dim);
  for (int64_t i = 0; i < T * dim; ++i) xb[i] = FloatToBf16(x[i]);
  const size_t n = l.slices.size();
  std::vector<std::vector<float>> partial(n > 1 ? n - 1 : 0);
  for (int64_t r0 = 0; r0 < T; r0 += l.max_tokens) {
    const int64_t rows = std::min(l.max_tokens, T - r0);
    const shm::ExpertCallInput in{
        static_cast<int32_t>(layer), static_cast<int32_t>(rows), top_k,
        static_cast<int32_t>(dim),   xb.data() + r0 * dim,       ids + r0 * top_k,
        weights + r0 * top_k};
    const absl::Time deadline = absl::Now() + options_.call_deadline;
    float* dst = out + r0 * dim;
    std::vector<std::future<absl::Status>> others;
    for (size_t s = 1; s < n; ++s) {
      partial[s - 1].resize(rows * dim);
      others.push_back(std::async(std::launch::async, [&, s] {
        return l.slices[s]->Call(in, partial[s - 1].data(), deadline);
      }));
    }
    absl::Status st = l.slices[0]->Call(in, dst, deadline);
    size_t failed = 0;
    for (size_t s = 1; s < n; ++s) {
      absl::Status o = others[s - 1].get();
      if (st.ok() && !o.ok()) {
        st = o;
        failed = s;
      }
    }
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("layer ", layer, ", expert endpoint ",
                                                  l.slices[failed]->label, ": ", st.message()));
    }
    for (size_t s = 1; s < n; ++s) {
      const float* p = partial[s - 1].data();
      for (int64_t i = 0; i < rows * dim; ++i) dst[i] += p[i];
    }
    NoteStepProgress();
  }
  return absl::OkStatus();
}

}  // namespace ss::gpu
