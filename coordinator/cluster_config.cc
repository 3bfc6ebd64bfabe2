#include "coordinator/cluster_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/file_write.h"
#include "common/layer_list.h"
#include "common/status.h"
#include "common/tensor_parallel.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.pb.h"

namespace ss::coord {
namespace {

using json = nlohmann::json;

absl::Status ReadInt(const json& j, const char* key, int min, int* out) {
  if (!j.contains(key)) return absl::OkStatus();
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster config: '", key, "' must be an integer >= ", min));
  }
  *out = v.get<int>();
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadString(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster config: ", where, ": '", key, "' must be a non-empty string"));
  }
  return j[key].get<std::string>();
}

// A layer list, from a string ("0-3,7") or an array of integers; every layer in [0, limit).
absl::StatusOr<std::vector<int>> ReadLayers(const json& j, const std::string& where, int limit) {
  std::vector<int> layers;
  const std::string what = absl::StrCat("cluster config: ", where, ": 'layers'");
  if (!j.contains("layers")) return absl::InvalidArgumentError(absl::StrCat(what, " is missing"));
  if (j["layers"].is_string()) {
    ASSIGN_OR_RETURN(layers, ParseLayerList(j["layers"].get<std::string>(), what));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a string such as \"0-20\""));
  }
  for (int l : layers) {
    if (l >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": layer ", l, " is outside the model's ", limit, " layers"));
    }
  }
  return layers;
}

}  // namespace

int ClusterConfig::num_gpu_workers() const {
  int n = 0;
  for (const StageSpec& s : stages) n += static_cast<int>(s.workers.size());
  return n;
}

std::vector<std::string> ClusterConfig::GpuWorkerIds() const {
  std::vector<std::string> ids;
  for (const StageSpec& s : stages) ids.insert(ids.end(), s.workers.begin(), s.workers.end());
  return ids;
}

absl::StatusOr<ClusterConfig> ParseClusterConfig(const std::string& json_text,
                                                 const ModelConfig& model) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("cluster config: not a JSON object");
  }
  static const std::set<std::string> kKeys = {
      "model_name",     "kv_block_tokens", "max_batch_tokens",      "max_running",
      "max_waiting",    "stages",          "heartbeat_interval_ms", "heartbeat_timeout_ms",
      "expert_workers", "max_model_len",   "stage_transport",       "enable_prefix_caching"};
  for (const auto& [key, value] : j.items()) {
    if (!kKeys.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("cluster config: unknown key '", key, "'"));
    }
  }
  ClusterConfig c;
  if (j.contains("model_name")) {
    ASSIGN_OR_RETURN(c.model_name, ReadString(j, "model_name", "top level"));
  }
  RETURN_IF_ERROR(ReadInt(j, "kv_block_tokens", 1, &c.kv_block_tokens));
  RETURN_IF_ERROR(ReadInt(j, "max_batch_tokens", 1, &c.max_batch_tokens));
  RETURN_IF_ERROR(ReadInt(j, "max_running", 1, &c.max_running));
  RETURN_IF_ERROR(ReadInt(j, "max_waiting", 0, &c.max_waiting));
  RETURN_IF_ERROR(ReadInt(j, "max_model_len", 1, &c.max_model_len));
  if (c.max_model_len > model.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster config: 'max_model_len' ", c.max_model_len,
        " exceeds the model's max_position_embeddings (", model.max_position_embeddings, ")"));
  }
  if (c.max_model_len == 0) c.max_model_len = static_cast<int>(model.max_position_embeddings);
  RETURN_IF_ERROR(ReadInt(j, "heartbeat_interval_ms", 10, &c.heartbeat_interval_ms));
  RETURN_IF_ERROR(ReadInt(j, "heartbeat_timeout_ms", 100, &c.heartbeat_timeout_ms));
  if (c.heartbeat_timeout_ms < 2 * c.heartbeat_interval_ms) {
    return absl::InvalidArgumentError(
        "cluster config: 'heartbeat_timeout_ms' must be at least twice 'heartbeat_interval_ms'");
  }
  if (j.contains("stage_transport")) {
    ASSIGN_OR_RETURN(c.stage_transport, ReadString(j, "stage_transport", "top level"));
    if (c.stage_transport != "grpc" && c.stage_transport != "nccl") {
      return absl::InvalidArgumentError(absl::StrCat("cluster config: 'stage_transport' is '",
                                                     c.stage_transport,
                                                     "'; expected \"grpc\" or \"nccl\""));
    }
  }
  if (j.contains("enable_prefix_caching")) {
    if (!j["enable_prefix_caching"].is_boolean()) {
      return absl::InvalidArgumentError(
          "cluster config: 'enable_prefix_caching' must be true or false");
    }
    c.enable_prefix_caching = j["enable_prefix_caching"].get<bool>();
  }
  if (c.max_batch_tokens < c.max_running) {
    return absl::InvalidArgumentError(
        "cluster config: 'max_batch_tokens' must be >= 'max_running' (one decode token each)");
  }
  for (int64_t layer = 0; layer < model.n_layers + model.n_mtp_layers; ++layer) {
    const int64_t ratio = model.compress_ratios.at(layer);
    if (ratio > 0 && c.kv_block_tokens % ratio != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster config: 'kv_block_tokens' ", c.kv_block_tokens,
          " must be a multiple of every compress ratio (layer ", layer, " has ", ratio, ")"));
    }
  }

  const int n_layers = static_cast<int>(model.n_layers);
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty()) {
    return absl::InvalidArgumentError("cluster config: 'stages' must be a non-empty array");
  }
  std::set<std::string> ids;
  int next_layer = 0;
  for (size_t s = 0; s < j["stages"].size(); ++s) {
    const json& js = j["stages"][s];
    const std::string where = absl::StrCat("stages[", s, "]");
    if (!js.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster config: ", where, " is not an object"));
    }
    StageSpec stage;
    ASSIGN_OR_RETURN(std::vector<int> layers, ReadLayers(js, where, n_layers));
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i] != next_layer) {
        return absl::InvalidArgumentError(
            absl::StrCat("cluster config: ", where,
                         ": layers must continue the previous stage in order "
                         "(expected layer ",
                         next_layer, ", got ", layers[i], ")"));
      }
      ++next_layer;
    }
    stage.first_layer = layers.front();
    stage.end_layer = layers.back() + 1;
    if (!js.contains("workers") || !js["workers"].is_array() || js["workers"].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster config: ", where, ": 'workers' must be a non-empty array of ids"));
    }
    for (const json& w : js["workers"]) {
      if (!w.is_string() || w.get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cluster config: ", where, ": every worker id must be a string"));
      }
      if (!ids.insert(w.get<std::string>()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("cluster config: worker id '", w.get<std::string>(), "' appears twice"));
      }
      stage.workers.push_back(w.get<std::string>());
    }
    c.stages.push_back(std::move(stage));
  }
  if (next_layer != n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("cluster config: the stages cover layers 0-",
                                                   next_layer - 1, " but the model has ",
                                                   n_layers));
  }
  const int tp = static_cast<int>(c.stages.front().workers.size());
  for (size_t s = 1; s < c.stages.size(); ++s) {
    if (static_cast<int>(c.stages[s].workers.size()) != tp) {
      return absl::InvalidArgumentError(
          "cluster config: every stage must have the same number of workers (TP size)");
    }
  }
  if (absl::Status split = CheckTensorParallelSplit(model, tp); !split.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster config: ", split.message(), " (TP size = workers per stage)"));
  }

  if (j.contains("expert_workers")) {
    if (!j["expert_workers"].is_array()) {
      return absl::InvalidArgumentError("cluster config: 'expert_workers' must be an array");
    }
    for (size_t e = 0; e < j["expert_workers"].size(); ++e) {
      const json& je = j["expert_workers"][e];
      const std::string where = absl::StrCat("expert_workers[", e, "]");
      if (!je.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cluster config: ", where, " is not an object"));
      }
      ExpertWorkerSpec w;
      ASSIGN_OR_RETURN(w.id, ReadString(je, "id", where));
      if (!ids.insert(w.id).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("cluster config: worker id '", w.id, "' appears twice"));
      }
      ASSIGN_OR_RETURN(w.layers, ReadLayers(je, where, n_layers));
      ASSIGN_OR_RETURN(const std::string slice, ReadString(je, "slice", where));
      ASSIGN_OR_RETURN(auto sl,
                       ParseSlice(slice, absl::StrCat("cluster config: ", where, ": 'slice'")));
      w.slice_index = sl.first;
      w.slice_count = sl.second;
      if (model.moe_inter_dim % (128 * w.slice_count) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cluster config: ", where, ": slice count ", w.slice_count, " does not split the ",
            model.moe_inter_dim, "-wide expert into 128-multiples"));
      }
      const bool has_shm = je.contains("shm"), has_grpc = je.contains("grpc");
      if (has_shm == has_grpc) {
        return absl::InvalidArgumentError(
            absl::StrCat("cluster config: ", where, ": give exactly one of 'shm' and 'grpc'"));
      }
      if (has_shm) {
        ASSIGN_OR_RETURN(w.shm_name, ReadString(je, "shm", where));
      } else {
        ASSIGN_OR_RETURN(w.grpc_address, ReadString(je, "grpc", where));
      }
      c.expert_workers.push_back(std::move(w));
    }
    // Per layer: the slices must be 0..n-1 of one n, each once.
    std::map<int, std::vector<const ExpertWorkerSpec*>> by_layer;
    for (const ExpertWorkerSpec& w : c.expert_workers) {
      for (int l : w.layers) by_layer[l].push_back(&w);
    }
    for (const auto& [layer, workers] : by_layer) {
      const int n = workers.front()->slice_count;
      std::set<int> seen;
      for (const ExpertWorkerSpec* w : workers) {
        if (w->slice_count != n || !seen.insert(w->slice_index).second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "cluster config: layer ", layer, ": its expert workers do not form one set of ",
              "slices (every slice i/n of one n exactly once); check '", w->id, "'"));
        }
      }
      if (static_cast<int>(seen.size()) != n) {
        return absl::InvalidArgumentError(absl::StrCat("cluster config: layer ", layer, ": only ",
                                                       seen.size(), " of its ", n,
                                                       " expert slices are served"));
      }
    }
  }
  return c;
}

absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path, const ModelConfig& model) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cluster config: cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(ss.str(), model);
  if (!c.ok())
    return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

std::string ClusterConfigToJson(const ClusterConfig& c) {
  json j;
  j["model_name"] = c.model_name;
  j["kv_block_tokens"] = c.kv_block_tokens;
  j["max_batch_tokens"] = c.max_batch_tokens;
  j["max_running"] = c.max_running;
  j["max_waiting"] = c.max_waiting;
  if (c.max_model_len > 0) j["max_model_len"] = c.max_model_len;
  j["heartbeat_interval_ms"] = c.heartbeat_interval_ms;
  j["heartbeat_timeout_ms"] = c.heartbeat_timeout_ms;
  j["stage_transport"] = c.stage_transport;
  j["enable_prefix_caching"] = c.enable_prefix_caching;
  j["stages"] = json::array();
  for (const StageSpec& s : c.stages) {
    std::vector<int> layers;
    for (int l = s.first_layer; l < s.end_layer; ++l) layers.push_back(l);
    j["stages"].push_back({{"layers", FormatIdList(layers)}, {"workers", s.workers}});
  }
  j["expert_workers"] = json::array();
  for (const ExpertWorkerSpec& w : c.expert_workers) {
    json jw = {{"id", w.id},
               {"layers", FormatIdList(w.layers)},
               {"slice", absl::StrCat(w.slice_index, "/", w.slice_count)}};
    if (!w.shm_name.empty()) jw["shm"] = w.shm_name;
    if (!w.grpc_address.empty()) jw["grpc"] = w.grpc_address;
    j["expert_workers"].push_back(std::move(jw));
  }
  return j.dump(2);
}

absl::StatusOr<std::vector<int>> AssignCudaDevices(int stages, int tp, int gpus, bool links) {
  if (stages < 1 || tp < 1 || gpus < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GPU layout: ", stages, " stage(s) of TP ", tp,
                                                   " on ", gpus, " GPU(s): all must be >= 1"));
  }
  if (tp > gpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU layout: TP ", tp, " needs ", tp,
                     " distinct GPUs per stage (NCCL forbids two ranks "
                     "of one communicator on one GPU), and this machine has ",
                     gpus, "; use --tp <= ", gpus, " (stages may share GPUs)"));
  }
  if (links && stages > 1 && stages * tp > gpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU layout: the nccl stage transport needs a GPU per GPU worker (", stages,
        " stages of TP ", tp, " on ", gpus,
        " GPUs): NCCL refuses a link whose two workers share a GPU, and a receiving worker's "
        "waiting NCCL kernel would time-slice a shared GPU with another process's compute; use "
        "fewer stages or stage_transport grpc"));
  }
  std::vector<int> devices;
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < tp; ++r) devices.push_back((s * tp + r) % gpus);
  }
  return devices;
}

std::string LaunchStageTransport(const std::string& requested, bool cuda, bool nccl, int stages,
                                 int tp, int gpus) {
  if (requested != "auto") return requested;
  return cuda && nccl && stages > 1 && stages * tp <= gpus ? "nccl" : "grpc";
}

int64_t MaxModelLen(const ClusterConfig& c, const ModelConfig& model) {
  return c.max_model_len > 0 ? c.max_model_len : model.max_position_embeddings;
}

int64_t LaunchKvTokens(int64_t requested, bool cuda, const std::vector<int>& devices,
                       int64_t fallback) {
  if (requested > 0) return requested;
  if (!cuda || devices.empty()) return fallback;
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() ? 0 : fallback;
}

int LaunchExpertWorkers(int requested, int nodes, int tp, bool cuda, int64_t moe_inter_dim) {
  int experts = requested > 0 ? requested : std::max(1, nodes);
  if (requested <= 0 && cuda && tp > experts && tp % experts == 0) experts = tp;
  while (experts > 1 && moe_inter_dim % (int64_t{128} * experts) != 0) --experts;
  return experts;
}

int64_t LaunchMaxBatchTokens(int64_t requested, bool may_stream) {
  if (requested > 0) return requested;
  return may_stream ? kLaunchStreamedStepTokens : kLaunchStepTokens;
}

LaunchNodes LaunchNodesOf(const std::vector<NumaNode>& nodes) {
  LaunchNodes out;
  for (const NumaNode& n : nodes) {
    if (n.core_cpus.empty()) continue;
    out.ids.push_back(n.os_index);
    out.cores.push_back(n.core_pus);
  }
  return out;
}

int LaunchExpertNode(int e, int experts, const std::vector<int>& node_ids) {
  const int nodes = static_cast<int>(node_ids.size());
  if (nodes < 2 || experts % nodes != 0 || e < 0 || e >= experts) return -1;
  return node_ids[e / (experts / nodes)];
}

LaunchCpus PlanLaunchCpus(const std::vector<std::vector<std::vector<int>>>& node_cores, int experts,
                          int serving, bool cuda) {
  LaunchCpus plan;
  size_t total = 0;
  for (const auto& cores : node_cores) total += cores.size();
  if (!cuda || serving < 1 || experts < 1 || total < 2 * static_cast<size_t>(serving)) return plan;
  // Reserve `serving` cores, one from the top of each node in turn, keeping a core in every node.
  std::vector<size_t> keep(node_cores.size());
  for (size_t n = 0; n < node_cores.size(); ++n) keep[n] = node_cores[n].size();
  std::vector<int> reserved;
  for (int taken = 0; taken < serving;) {
    const int before = taken;
    for (size_t n = 0; n < node_cores.size() && taken < serving; ++n) {
      if (keep[n] <= 1) continue;
      --keep[n];
      const std::vector<int>& pus = node_cores[n][keep[n]];
      reserved.insert(reserved.end(), pus.begin(), pus.end());
      ++taken;
    }
    if (taken == before) return plan;  // every node is down to one core
  }
  // The PUs of cores [first, last).
  auto pus_of = [](auto first, auto last) {
    std::vector<int> out;
    for (; first != last; ++first) out.insert(out.end(), first->begin(), first->end());
    return out;
  };
  if (static_cast<size_t>(experts) % node_cores.size() == 0) {
    // k workers to a node, each on an equal share of its node's cores (LaunchExpertNode).
    const size_t k = static_cast<size_t>(experts) / node_cores.size();
    for (size_t n = 0; n < node_cores.size(); ++n) {
      if (keep[n] < k) return plan;
      for (size_t i = 0; i < k; ++i) {
        plan.experts.push_back(pus_of(node_cores[n].begin() + keep[n] * i / k,
                                      node_cores[n].begin() + keep[n] * (i + 1) / k));
      }
    }
  } else {
    std::vector<std::vector<int>> left;  // the remaining cores, node after node
    for (size_t n = 0; n < node_cores.size(); ++n) {
      left.insert(left.end(), node_cores[n].begin(), node_cores[n].begin() + keep[n]);
    }
    if (left.size() < static_cast<size_t>(experts)) return plan;
    for (size_t e = 0; e < static_cast<size_t>(experts); ++e) {
      plan.experts.push_back(pus_of(left.begin() + left.size() * e / experts,
                                    left.begin() + left.size() * (e + 1) / experts));
    }
  }
  std::sort(reserved.begin(), reserved.end());
  plan.serving = std::move(reserved);
  return plan;
}

LaunchCpus PlanLaunchCpusFor(const std::vector<std::vector<std::vector<int>>>& node_cores,
                             int experts, int gpu_workers, bool coordinator, bool cuda) {
  LaunchCpus plan;
  for (int per_worker : {2, 1}) {
    plan =
        PlanLaunchCpus(node_cores, experts, per_worker * gpu_workers + (coordinator ? 1 : 0), cuda);
    if (plan.split()) break;
  }
  return plan;
}

std::vector<std::pair<std::string, std::string>> CpuDropIns(const LaunchCpus& plan,
                                                            bool coordinator, bool one_per_node,
                                                            const std::string& command) {
  std::vector<std::pair<std::string, std::string>> files;
  if (!plan.split()) return files;
  const auto file = [&](const std::string& unit, const std::string& what, std::vector<int> cpus) {
    std::sort(cpus.begin(), cpus.end());
    files.emplace_back(unit + ".d/50-splitserve-cpus.conf",
                       absl::StrCat("# Written by `", command, "`: ", what,
                                    " (deploy/README.md, \"CPUs on a host with GPU workers and "
                                    "expert workers\").\n[Service]\nCPUAffinity=",
                                    FormatIdList(cpus), "\n"));
  };
  const std::string serving = coordinator ? "the GPU workers' and the coordinator's whole cores"
                                          : "the GPU workers' whole cores";
  file("splitserve-gpu-worker@.service", serving, plan.serving);
  if (coordinator) file("splitserve-coordinator.service", serving, plan.serving);
  if (one_per_node) {
    std::vector<int> experts;
    for (const std::vector<int>& e : plan.experts)
      experts.insert(experts.end(), e.begin(), e.end());
    file("splitserve-expert-worker@.service",
         "the expert workers' cores, each worker on its NUMA node's", experts);
  }
  return files;
}

absl::StatusOr<std::vector<std::string>> WriteFiles(
    const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::string> written;
  for (const auto& [path, text] : files) {
    const std::filesystem::path file = std::filesystem::path(dir) / path;
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", file.parent_path().string(), ": ", ec.message()));
    }
    RETURN_IF_ERROR(WriteFileAtomically(file.string(), text));
    written.push_back(file.string());
  }
  return written;
}

int StageOf(const ClusterConfig& c, const std::string& worker_id) {
  for (size_t s = 0; s < c.stages.size(); ++s) {
    for (const std::string& w : c.stages[s].workers) {
      if (w == worker_id) return static_cast<int>(s);
    }
  }
  return -1;
}

std::vector<std::string> TpPeers(const ClusterConfig& c, const std::string& worker_id) {
  std::vector<std::string> peers;
  const int s = StageOf(c, worker_id);
  if (s < 0) return peers;
  for (const std::string& w : c.stages[s].workers) {
    if (w != worker_id) peers.push_back(w);
  }
  return peers;
}

std::vector<std::string> FatePeers(const ClusterConfig& c, const std::string& worker_id) {
  if (c.stage_transport != "nccl" || c.stages.size() < 2 || StageOf(c, worker_id) < 0) {
    return TpPeers(c, worker_id);
  }
  std::vector<std::string> peers;
  for (const std::string& w : c.GpuWorkerIds()) {
    if (w != worker_id) peers.push_back(w);
  }
  return peers;
}

absl::StatusOr<splitserve::v1::Role> RoleFor(const ClusterConfig& c, const std::string& worker_id) {
  for (size_t s = 0; s < c.stages.size(); ++s) {
    const StageSpec& stage = c.stages[s];
    for (size_t r = 0; r < stage.workers.size(); ++r) {
      if (stage.workers[r] != worker_id) continue;
      splitserve::v1::Role role;
      const int tp = static_cast<int>(stage.workers.size());
      role.set_stage(static_cast<int>(s));
      role.set_num_stages(static_cast<int>(c.stages.size()));
      role.set_tp_rank(static_cast<int>(r));
      role.set_tp_size(tp);
      role.set_first_layer(stage.first_layer);
      role.set_end_layer(stage.end_layer);
      role.set_runs_mtp(s + 1 == c.stages.size());
      role.set_kv_block_tokens(c.kv_block_tokens);
      role.set_max_batch_tokens(c.max_batch_tokens);
      role.set_max_running(c.max_running);
      role.set_max_model_len(c.max_model_len);
      role.set_heartbeat_interval_ms(c.heartbeat_interval_ms);
      role.set_model_name(c.model_name);
      role.set_stage_transport(c.stage_transport);
      for (int layer = stage.first_layer; layer < stage.end_layer; ++layer) {
        splitserve::v1::LayerExperts* le = nullptr;
        for (const ExpertWorkerSpec& w : c.expert_workers) {
          bool holds = false;
          for (int l : w.layers) holds |= l == layer;
          if (!holds) continue;
          if (le == nullptr) {
            le = role.add_experts();
            le->set_layer(layer);
            le->set_slice_count(w.slice_count);
          }
          if (w.slice_index % tp != static_cast<int>(r)) continue;
          splitserve::v1::ExpertEndpoint* ep = le->add_endpoints();
          ep->set_slice_index(w.slice_index);
          ep->set_slice_count(w.slice_count);
          ep->set_shm_name(w.shm_name);
          ep->set_grpc_address(w.grpc_address);
          ep->set_worker_id(w.id);
        }
        if (le != nullptr) {
          std::sort(le->mutable_endpoints()->begin(), le->mutable_endpoints()->end(),
                    [](const auto& a, const auto& b) { return a.slice_index() < b.slice_index(); });
        }
      }
      return role;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("worker id '", worker_id, "' is not a GPU worker of the cluster config"));
}

}  // namespace ss::coord
