// How often each routed expert of a stage's layers is chosen: the input of the resident-expert
// placement (expert_placement.h) and the dashboard's heat map (gpu_worker_expert_routed_total,
// stage_runner.h). RoutedExpertsClient::Compute counts every choice it is given, so the counts
// cover decode steps and prefill chunks on the CPU path; a streamed prefill chunk's routing stays
// on the GPU and is not counted. Under TP every rank counts the same choices.
//
// Thread-safety: Count and the readers from any thread, lock-free (relaxed atomics: a reader may
// see a call's choices partly counted).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace ss::gpu {

class ExpertHeat {
 public:
  // Layers [first_layer, end_layer) of a model with `n_experts` routed experts a layer.
  ExpertHeat(int first_layer, int end_layer, int n_experts);

  // One call's choices of `layer` (ids [n]): each id in [0, n_experts) counts once; other ids
  // (a skipped choice, model::kSkippedExpert) and layers outside the range are not counted.
  void Count(int64_t layer, const int32_t* ids, int64_t n);

  int first_layer() const { return first_layer_; }
  int end_layer() const { return end_layer_; }
  int n_experts() const { return n_experts_; }
  // Choices of (layer, expert) so far; 0 outside the range.
  uint64_t count(int64_t layer, int expert) const;
  // Every count, layer-major: [(layer − first_layer)·n_experts + expert].
  std::vector<uint64_t> Snapshot() const;

 private:
  const int first_layer_, end_layer_, n_experts_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
};

}  // namespace ss::gpu
