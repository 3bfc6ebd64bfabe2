#include "gpu_worker/cuda/host_routed_experts.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"
#include "gpu_worker/cuda_status.h"
#include "gpu_worker/expert_placement.h"
#include "gpu_worker/kernels/host_call.h"
#include "gpu_worker/step_progress.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

// How long a layer's HostCallAwait waits for the host before it fails the step: far beyond any
// expert call (those have deadlines of their own), so only a wedged host thread reaches it.
constexpr uint64_t kHostCallTimeoutNs = uint64_t{600} * 1000 * 1000 * 1000;

}  // namespace

HostRoutedExperts::HostRoutedExperts(
    const model::Model& model,
    const std::function<const model::RoutedExperts*(int64_t layer)>& experts, int first_layer,
    int tp, int rank)
    : model_(model), experts_(experts), first_layer_(first_layer), tp_(tp), rank_(rank) {}

// A layer's host call (HostExpertsCall), on the server's thread: skipped once an earlier layer of
// the step failed (the step fails with that error; the rest of it only has to finish).
void HostRoutedExperts::Serve(int l) {
  HostExpertsCall& call = *calls_[l];
  if (failed_.load()) {
    call.status = absl::CancelledError("an earlier layer's routed experts failed");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  call.status = Compute(call.layer, call.rows);
  call.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!call.status.ok()) failed_.store(true);
}

absl::Status HostRoutedExperts::PrepareStep(int n_layers, int64_t rows) {
  const ModelConfig& c = model_.config();
  const int64_t T = rows, dim = c.dim, K = c.n_activated_experts;
  for (auto [buf, bytes] : {std::pair{&moe_x_, T * dim * 2},
                            {&moe_ids_, T * K * 4},
                            {&moe_w_, T * K * 4},
                            {&moe_sum_, T * dim * 4}}) {
    RETURN_IF_ERROR(buf->Reserve(static_cast<size_t>(bytes)));
  }
  while (calls_.size() < static_cast<size_t>(n_layers)) {
    auto call = std::make_unique<HostExpertsCall>();
    call->layer = first_layer_ + static_cast<int64_t>(calls_.size());
    calls_.push_back(std::move(call));
  }
  failed_.store(false);
  for (int l = 0; l < n_layers; ++l) {
    HostExpertsCall& hcall = *calls_[l];
    hcall.rows = T;
    hcall.status = absl::OkStatus();
    hcall.seconds = 0.0;
  }
  if (server_ == nullptr) {
    RETURN_IF_ERROR(arrivals_.Reserve(sizeof(unsigned)));
    CUDA_RETURN_IF_ERROR(cudaMemset(arrivals_.p, 0, sizeof(unsigned)));
    ASSIGN_OR_RETURN(server_, HostCallServer::Create(kMaxHostCalls, [this](int l) { Serve(l); }));
  }
  return server_->Arm(n_layers);
}

absl::Status HostRoutedExperts::Enqueue(int l, const cuda::bf16_t* xn, const int32_t* ids,
                                        const float* weights, int64_t rows, float* sum,
                                        cudaStream_t side) {
  const ModelConfig& c = model_.config();
  const int64_t T = rows, dim = c.dim, K = c.n_activated_experts;
  const int64_t sum_bytes = T * dim * 4;
  const bool await_copies = sum_bytes <= cuda::kHostCallAwaitCopyMax;
  cuda::HostCallPublishParams pub{.segments = {{xn, moe_x_.p, T * dim * 2},
                                               {ids, moe_ids_.p, T * K * 4},
                                               {weights, moe_w_.p, T * K * 4}},
                                  .n_segments = 3,
                                  .seq = server_->seq(),
                                  .req = server_->req(l),
                                  .arrivals = arrivals_.as<unsigned>()};
  CUDA_RETURN_IF_ERROR(cuda::HostCallPublish(pub, side));
  CUDA_RETURN_IF_ERROR(cuda::HostCallAwait({.seq = server_->seq(),
                                            .done = server_->done(l),
                                            .src = moe_sum_.p,
                                            .dst = sum,
                                            .bytes = await_copies ? sum_bytes : 0,
                                            .timeout_ns = kHostCallTimeoutNs,
                                            .timed_out = server_->timed_out_flag()},
                                           side));
  if (!await_copies) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sum, moe_sum_.p, sum_bytes, cudaMemcpyHostToDevice, side));
  }
  return absl::OkStatus();
}

absl::Status HostRoutedExperts::StepStatus(int n_layers) const {
  if (server_ != nullptr && server_->timed_out()) {
    return absl::DeadlineExceededError(
        absl::StrCat("routed experts: the host thread did not answer a layer's call within ",
                     kHostCallTimeoutNs / 1000000000, " s"));
  }
  for (int l = 0; l < n_layers; ++l) {
    const HostExpertsCall& hcall = *calls_[l];
    if (!hcall.status.ok() && !absl::IsCancelled(hcall.status)) return hcall.status;
  }
  return absl::OkStatus();
}

void HostRoutedExperts::AppendGraphKey(std::vector<int64_t>* key) const {
  for (const void* p : {moe_x_.p, moe_ids_.p, moe_w_.p, moe_sum_.p, arrivals_.p}) {
    key->push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)));
  }
}

absl::Status HostRoutedExperts::Compute(int64_t layer, int64_t rows) {
  const ModelConfig& c = model_.config();
  const int64_t dim = c.dim, K = c.n_activated_experts, E = c.n_routed_experts;
  host_x_.resize(rows * dim);
  const uint16_t* xb = moe_x_.as<uint16_t>();
  for (int64_t i = 0; i < rows * dim; ++i) host_x_[i] = Bf16ToFloat(xb[i]);
  const int32_t* ridx = moe_ids_.as<int32_t>();
  const float* rw = moe_w_.as<float>();
  float* acc = moe_sum_.as<float>();
  const model::RoutedExperts* experts = experts_ ? experts_(layer) : nullptr;
  if (experts != nullptr) {
    return experts->Compute(layer, rows, host_x_.data(), ridx, rw, static_cast<int>(K), acc);
  }
  model::RouterResult r;
  r.indices.assign(ridx, ridx + rows * K);
  r.weights.assign(rw, rw + rows * K);
  if (tp_ > 1) {
    // This rank's experts only (RoutedSum skips ids matching no expert).
    const auto [e0, e1] = HostWeightsRange(static_cast<int>(E), tp_, rank_);
    for (int32_t& e : r.indices) {
      if (e < e0 || e >= e1) e = -1;
    }
  }
  model::RoutedSum(model_.weights().blocks[layer].moe, c, host_x_.data(), r, rows, acc);
  NoteStepProgress();
  return absl::OkStatus();
}

}  // namespace ss::gpu::cuda_backend_internal
