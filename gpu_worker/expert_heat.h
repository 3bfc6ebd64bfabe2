// The routed-expert path's statistics of a stage: how often each routed expert of its layers is
// chosen (the input of the resident-expert placement, expert_placement.h, and the dashboard's
// heat map), where each layer's choices were computed (on this GPU by resident experts, or on the
// CPU: expert workers or host weights), the bytes of expert weights the CPU read for them, and the
// resident set's moves (expert_rebalancer.h). Exported by ExportExpertHeat (stage_runner.h).
//
// RoutedExpertsClient::Compute counts every choice it is given (path kCpu); the resident path
// counts the ones it served (kGpu) on the device and adds them here when Refresh is called (its
// source: readers that want them current call Refresh first: the metrics at each scrape, the
// rebalance at each round). So the counts cover decode steps and prefill chunks on the CPU path; a
// streamed prefill chunk's routing stays on the GPU and is not counted. Under TP every rank counts
// the same choices; its CPU bytes are its own slices'.
//
// Thread-safety: every method from any thread; the counts are lock-free (relaxed atomics: a reader
// may see a call's choices partly counted); SetSource and Refresh serialise on a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace ss::gpu {

enum class ChoicePath { kCpu = 0, kGpu = 1 };

class ExpertHeat {
 public:
  // Layers [first_layer, end_layer) of a model with `n_experts` routed experts a layer.
  ExpertHeat(int first_layer, int end_layer, int n_experts);

  // One call's choices of `layer` (ids [n]), computed on `path`: each id in [0, n_experts)
  // counts once; other ids (a skipped choice, model::kSkippedExpert) and layers outside the
  // range are not counted.
  void Count(int64_t layer, const int32_t* ids, int64_t n, ChoicePath path = ChoicePath::kCpu);
  // `n` choices of (layer, expert) on `path` (ignored outside the range).
  void Add(int64_t layer, int expert, uint64_t n, ChoicePath path);
  // The counts kept elsewhere (the resident path's device counters): `source` adds what it counted
  // since its last call (through Add). Refresh calls it; SetSource(nullptr) detaches it (its owner
  // must before it goes).
  void SetSource(std::function<void()> source);
  void Refresh() const;
  // Bytes of expert weights the CPU read for a call (each distinct expert's bytes once).
  void AddCpuRead(int64_t bytes);
  // `swaps` resident experts replaced, `bytes` of weights copied to the GPU for them.
  void AddRebalance(int64_t swaps, int64_t bytes);

  int first_layer() const { return first_layer_; }
  int end_layer() const { return end_layer_; }
  int n_experts() const { return n_experts_; }
  // Choices of (layer, expert) so far, on either path; 0 outside the range.
  uint64_t count(int64_t layer, int expert) const;
  // Every count, layer-major: [(layer − first_layer)·n_experts + expert].
  std::vector<uint64_t> Snapshot() const;
  // Choices of `layer` computed on `path`; 0 outside the range.
  uint64_t choices(int64_t layer, ChoicePath path) const;
  uint64_t cpu_read_bytes() const { return cpu_read_bytes_.load(std::memory_order_relaxed); }
  uint64_t rebalance_swaps() const { return rebalance_swaps_.load(std::memory_order_relaxed); }
  uint64_t rebalance_bytes() const { return rebalance_bytes_.load(std::memory_order_relaxed); }

 private:
  const int first_layer_, end_layer_, n_experts_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::unique_ptr<std::atomic<uint64_t>[]> paths_;  // [(layer − first_layer)·2 + path]
  std::atomic<uint64_t> cpu_read_bytes_{0}, rebalance_swaps_{0}, rebalance_bytes_{0};
  mutable std::mutex source_mu_;
  std::function<void()> source_;
};

}  // namespace ss::gpu
