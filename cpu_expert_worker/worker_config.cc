#include "cpu_expert_worker/worker_config.h"

#include <cstring>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/expert_store_format.h"
#include "common/status.h"
#include "cpu_expert_worker/kernels/dispatch.h"

namespace ss::expert {
namespace {

absl::StatusOr<int> ParseNonNegative(absl::string_view s, absl::string_view what) {
  int v = 0;
  if (!absl::SimpleAtoi(s, &v) || v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", s, "' is not a non-negative integer"));
  }
  return v;
}

}  // namespace

absl::StatusOr<int> ParseNumaNode(absl::string_view spec) {
  if (spec == "auto") return -1;
  return ParseNonNegative(spec, "--numa_node (a node number or 'auto')");
}

absl::StatusOr<WorkerConfig> ParseWorkerConfig(const WorkerFlags& f) {
  WorkerConfig c;
  if (f.model.empty()) return absl::InvalidArgumentError("--model DIR is required");
  c.source.model_dir = f.model;
  ASSIGN_OR_RETURN(c.source.load_format, ParseLoadFormat(f.load_format));
  RETURN_IF_ERROR(ValidateHfOverrides(f.hf_overrides));
  c.source.hf_overrides = f.hf_overrides;
  c.all_layers = f.layers == "all";
  if (!c.all_layers) {
    ASSIGN_OR_RETURN(c.layers, ParseLayerList(f.layers));
  }
  std::pair<int, int> slice;
  ASSIGN_OR_RETURN(slice, ParseSlice(f.slice));
  c.slice_index = slice.first;
  c.slice_count = slice.second;
  ASSIGN_OR_RETURN(c.numa_node, ParseNumaNode(f.numa_node));
  if (f.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads ", f.threads, ": use 0 for every physical core of the node"));
  }
  c.threads = f.threads;
  const auto isa = ParseIsa(f.isa);
  if (!isa.ok()) return absl::InvalidArgumentError(absl::StrCat("--isa: ", isa.status().message()));
  c.isa = f.isa;
  c.shm_name = f.shm_name;
  c.grpc_listen = f.grpc_listen;
  if (f.store_memory != "auto" && f.store_memory != "anonymous" && f.store_memory != "shared") {
    return absl::InvalidArgumentError(
        absl::StrCat("--store_memory ", f.store_memory, " (auto, anonymous or shared)"));
  }
  if (f.store_memory == "shared" && f.shm_name.empty()) {
    return absl::InvalidArgumentError(
        "--store_memory shared needs --shm_name (the store's segment is <shm_name>-store)");
  }
  if (f.store_memory != "anonymous" && !f.shm_name.empty()) {
    c.store_segment = ExpertStoreSegmentName(f.shm_name);
    c.store_segment_optional = f.store_memory == "auto";
  }
  if (f.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max_tokens ", f.max_tokens, " < 1"));
  }
  c.max_tokens = f.max_tokens;
  if (f.spin_us < 0) return absl::InvalidArgumentError(absl::StrCat("--spin_us ", f.spin_us));
  c.spin_us = f.spin_us;
  if (f.split_target < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--split_target ", f.split_target, " < 1"));
  }
  c.split_target = f.split_target;
  if (f.min_split_cols < 128 || f.min_split_cols % 128 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min_split_cols ", f.min_split_cols, " is not a positive multiple of 128"));
  }
  c.min_split_cols = f.min_split_cols;
  if (f.engine_passes != 1 && f.engine_passes != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--engine_passes ", f.engine_passes, ": expected 1 or 2"));
  }
  c.engine_passes = f.engine_passes;
  if (f.weight_layout != "tiled" && f.weight_layout != "rows") {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_layout ", f.weight_layout, " (tiled or rows)"));
  }
  c.tiled_weights = f.weight_layout == "tiled";
  if (f.selftest < -1) {
    return absl::InvalidArgumentError(absl::StrCat("--selftest ", f.selftest, " < 0"));
  }
  c.selftest = f.selftest;
  if (f.selftest_tokens < 1 || f.selftest_tokens > f.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--selftest_tokens ", f.selftest_tokens,
                                                   " is outside [1, --max_tokens ", f.max_tokens,
                                                   "]"));
  }
  c.selftest_tokens = f.selftest_tokens;
  if (f.insecure_cluster && !f.cluster_token_file.empty()) {
    return absl::InvalidArgumentError(
        "--insecure_cluster and --cluster_token_file exclude each other");
  }
  c.cluster_token_file = f.cluster_token_file;
  c.metrics_listen = f.metrics_listen;
  c.load_progress_file = f.load_progress_file;
  c.insecure_cluster = f.insecure_cluster;
  return c;
}

}  // namespace ss::expert
