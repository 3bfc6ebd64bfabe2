// The GPU worker's client of the expert workers (ARCHITECTURE.md "The MoE call"): a
// model::RoutedExperts that sends each MoE layer's rows to the expert workers serving that layer
// and returns the sum of their partials.
//
// A layer's endpoints are its slices 0..n-1 of one n (proto LayerExperts), each an expert
// worker's shared-memory segment (same host, ss::expert::shm::ShmClient) or gRPC address
// (ss::expert::grpc_transport::GrpcExpertClient). One connection per distinct endpoint, shared
// by every layer it serves. A call:
//   1. converts x (bf16-valued fp32) to bf16 bits, exactly;
//   2. cuts the T rows into chunks of at most the layer's max_tokens (the smallest its
//      endpoints accept);
//   3. calls every slice of each chunk (slices > 0 on their own threads, slice 0 on the caller's)
//      with a deadline of `call_deadline` from the chunk's start;
//   4. out = partial_0, then out += partial_i for i = 1..n-1 (fp32, slice order).
// With one slice the worker's partial is the answer unchanged: an expert worker that returns
// RoutedSum's values (one whole-expert slice, scalar ISA) gives results bit-identical to local
// experts. A layer with no endpoints is computed here by the reference (model::RoutedSum). A call
// whose choices are all model::kSkippedExpert (computed elsewhere: resident on the GPU) returns
// zeros without calling the workers. Every error names the layer and the endpoint.
//
// Tensor parallelism (ARCHITECTURE.md "The MoE call"): slice i of a layer's n belongs to TP rank
// i mod tp_size, and each rank's client holds and calls only its own slices (ExpertSlicesForRank
// cuts a whole list down; a coordinator's Role already carries only them). Compute then returns
// the sum of this rank's partials (in slice order), and the cuda backend's MoE all-reduce adds
// the ranks' sums. A rank given no slice of a remote layer (n <= tp_rank: LayerExpertsConfig with
// no endpoints and slice_count > 0) returns zeros for it -- remote() is true, so its backend does
// not compute a share of those experts locally.
//
// Connect waits (up to `connect_timeout`) for expert workers that are still loading: a segment
// that does not exist yet or a gRPC address that refuses connections is retried; any other
// refusal (another protocol version, a dim or top_k that does not match the model, a gRPC
// worker whose reported slice or layers differ from the endpoint's) fails at once.
//
// Threads: Compute may be called from any number of threads at once (the transports allow it).
// The Model must outlive the client.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/model.h"
#include "gpu_worker/expert_heat.h"
#include "proto/cluster_credential.h"

namespace ss::gpu {

struct ExpertEndpointConfig {
  int slice_index = 0;
  int slice_count = 1;
  std::string shm_name;  // exactly one of shm_name / grpc_address
  std::string grpc_address;
  std::string worker_id;  // for logs; may be empty

  // "shm:NAME" or "grpc:HOST:PORT" (the --experts spelling), plus " (worker ID)" when known.
  std::string Describe() const;
};

struct LayerExpertsConfig {
  int layer = 0;
  // This TP rank's slices (with TP 1: all of them); empty and slice_count 0: computed locally.
  std::vector<ExpertEndpointConfig> endpoints;
  // The layer's slices over the whole TP group; 0 = the endpoints' own slice_count. Set, with no
  // endpoints: expert workers serve the layer but none of its slices is this rank's (it adds 0).
  int slice_count = 0;
};

// Checks one layer's endpoints for TP rank `tp_rank` of `tp_size`: each sets exactly one
// transport, all share one slice_count n (equal to the layer's slice_count when set), and their
// slice indices are exactly the slices i of 0..n-1 with i mod tp_size == tp_rank, once each (TP 1:
// all of 0..n-1). InvalidArgument naming the layer otherwise.
absl::Status ValidateLayerExperts(const LayerExpertsConfig& layer, int tp_rank = 0,
                                  int tp_size = 1);

// The layers as TP rank `tp_rank` of `tp_size` serves them: each remote layer keeps the endpoints
// of its slices i with i mod tp_size == tp_rank and records the layer's slice count; local layers
// stay as they are. `layers` lists whole layers (all slices, as the --experts flag gives them).
std::vector<LayerExpertsConfig> ExpertSlicesForRank(const std::vector<LayerExpertsConfig>& layers,
                                                    int tp_rank, int tp_size);

struct ExpertClientOptions {
  absl::Duration call_deadline = absl::Seconds(30);    // per chunk call
  absl::Duration connect_timeout = absl::Seconds(60);  // waiting for workers that are loading
  const std::atomic<bool>* cancel = nullptr;           // optional: set -> Connect stops waiting
  int tp_rank = 0;  // the layers' endpoints are this rank's slices (ValidateLayerExperts)
  int tp_size = 1;
  ClusterCredential credential;  // carried by the calls to gRPC endpoints
  ExpertHeat* heat = nullptr;    // optional, borrowed: every call's choices are counted there
  // How long a call to a shared-memory endpoint busy-polls for the answer before it sleeps
  // (shm::ShmClientOptions::spin): short where the caller shares cores with the expert workers'
  // compute (the cpu backend), long where it runs on a thread with nothing else to do (the cuda
  // backend's host call server), so a decode call's answer does not wait for a wake-up.
  absl::Duration shm_answer_spin = absl::Microseconds(20);
};

class RoutedExpertsClient final : public model::RoutedExperts {
 public:
  // Validates every layer (ids inside the model's blocks and MTP blocks, no layer twice) and
  // connects every distinct endpoint.
  static absl::StatusOr<std::unique_ptr<RoutedExpertsClient>> Connect(
      const model::Model& model, const std::vector<LayerExpertsConfig>& layers,
      const ExpertClientOptions& options = {});
  ~RoutedExpertsClient() override;

  absl::Status Compute(int64_t layer, int64_t T, const float* x, const int32_t* ids,
                       const float* weights, int top_k, float* out) const override;

  // Whether `layer` is served by expert workers (false: computed locally), this rank's slices
  // of it possibly none.
  bool remote(int64_t layer) const { return layers_.count(layer) != 0; }

  class Endpoint;

 private:
  struct Layer {
    std::vector<const Endpoint*> slices;  // this rank's, in slice order; empty: it adds zero
    int64_t max_tokens = 0;
    double share = 0;  // this rank's slices ÷ the layer's: its share of each expert's bytes
  };
  // Counts a call's choices and the bytes of the distinct experts it reads (options_.heat).
  void CountCall(int64_t layer, const int32_t* ids, int64_t n, double share) const;
  RoutedExpertsClient(const model::Model& model, const ExpertClientOptions& options);
  absl::Status ComputeLocal(int64_t layer, int64_t T, const float* x, const int32_t* ids,
                            const float* weights, int top_k, float* out) const;

  const model::Model& model_;
  const ExpertClientOptions options_;
  std::map<std::string, std::unique_ptr<Endpoint>> endpoints_;  // by Describe() without worker
  std::map<int64_t, Layer> layers_;
};

}  // namespace ss::gpu
