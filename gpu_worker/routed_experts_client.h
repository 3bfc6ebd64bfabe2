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
// experts. A layer with no endpoints is computed here by the reference (model::RoutedSum).
// Every error names the layer and the endpoint.
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
  std::vector<ExpertEndpointConfig> endpoints;  // empty: computed locally
};

// Checks one layer's endpoints: each sets exactly one transport, all share one slice_count n
// and their slice indices are 0..n-1 once each. InvalidArgument naming the layer otherwise.
absl::Status ValidateLayerExperts(const LayerExpertsConfig& layer);

struct ExpertClientOptions {
  absl::Duration call_deadline = absl::Seconds(30);    // per chunk call
  absl::Duration connect_timeout = absl::Seconds(60);  // waiting for workers that are loading
  const std::atomic<bool>* cancel = nullptr;           // optional: set -> Connect stops waiting
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

  // Whether `layer` is served by expert workers (false: computed locally).
  bool remote(int64_t layer) const { return layers_.count(layer) != 0; }

  class Endpoint;

 private:
  struct Layer {
    std::vector<const Endpoint*> slices;  // slice order
    int64_t max_tokens = 0;
  };
  RoutedExpertsClient(const model::Model& model, const ExpertClientOptions& options);
  absl::Status ComputeLocal(int64_t layer, int64_t T, const float* x, const int32_t* ids,
                            const float* weights, int top_k, float* out) const;

  const model::Model& model_;
  const ExpertClientOptions options_;
  std::map<std::string, std::unique_ptr<Endpoint>> endpoints_;  // by Describe() without worker
  std::map<int64_t, Layer> layers_;
};

}  // namespace ss::gpu
