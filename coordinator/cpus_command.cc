#include "coordinator/cpus_command.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/layer_list.h"
#include "common/numa_topology.h"
#include "coordinator/cluster_config.h"

namespace ss {
namespace {

constexpr char kCpusUsage[] =
    "usage: splitserve cpus --gpu-workers N [--expert-workers N|auto] [--coordinator yes|no]\n"
    "                       [--write-dropins DIR]\n"
    "  Prints how `splitserve up` would share this host's CPUs between N GPU workers (cuda\n"
    "  backend), the coordinator (unless --coordinator no) and the expert workers (default one\n"
    "  per NUMA node): whole cores for the GPU workers and the coordinator (two a GPU worker,\n"
    "  or one where two do not fit, and one for the coordinator), the rest for the experts, so\n"
    "  that no expert thread shares its core with a spinning one. For hosts run by the systemd\n"
    "  units (CPUAffinity=). --write-dropins DIR (e.g. /etc/systemd/system) also writes the\n"
    "  split as drop-ins of the units (<unit>.d/50-splitserve-cpus.conf; the expert workers'\n"
    "  only with one per NUMA node); then `systemctl daemon-reload` and restart the units.\n"
    "  For another host: HWLOC_XMLFILE=host.xml (its `lstopo --of xml`) or HWLOC_SYNTHETIC=\n"
    "  'pack:2 numa:1 core:32 pu:2' prints the split of that topology, all of its CPUs allowed.\n";

bool ParseInt(const std::string& s, int64_t min, int64_t max, int64_t* out) {
  return absl::SimpleAtoi(s, out) && *out >= min && *out <= max;
}

// "0-27,32-59".
std::string CpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  return FormatIdList(cpus);
}

}  // namespace

int RunCpusCommand(int argc, char** argv) {
  int64_t gpu_workers = -1, experts = 0;
  bool coordinator = true;
  std::string dropins;  // --write-dropins
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      std::fputs(kCpusUsage, stdout);
      return 0;
    }
    if (name != "--gpu-workers" && name != "--expert-workers" && name != "--coordinator" &&
        name != "--write-dropins") {
      std::fprintf(stderr, "splitserve cpus: unknown option '%s' (see --help)\n", name.c_str());
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "splitserve cpus: %s needs a value\n%s", name.c_str(), kCpusUsage);
      return 2;
    }
    const std::string value = argv[++i];
    bool ok = true;
    if (name == "--gpu-workers") {
      ok = ParseInt(value, 1, 64, &gpu_workers);
    } else if (name == "--expert-workers") {
      ok = value == "auto" || ParseInt(value, 1, 64, &experts);
    } else if (name == "--coordinator") {
      ok = value == "yes" || value == "no";
      coordinator = value == "yes";
    } else if (name == "--write-dropins") {
      ok = !value.empty();
      dropins = value;
    } else {
      std::fprintf(stderr, "splitserve cpus: unknown option '%s' (see --help)\n", name.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "splitserve cpus: %s %s: bad value\n%s", name.c_str(), value.c_str(),
                   kCpusUsage);
      return 2;
    }
  }
  if (gpu_workers < 0) {
    std::fprintf(stderr, "splitserve cpus: --gpu-workers is required\n%s", kCpusUsage);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<NumaTopology>> topo = NumaTopology::Discover();
  if (!topo.ok()) {
    std::fprintf(stderr, "splitserve cpus: %s\n", std::string(topo.status().message()).c_str());
    return 1;
  }
  const coord::LaunchNodes nodes = coord::LaunchNodesOf((*topo)->nodes());
  const std::vector<std::vector<std::vector<int>>>& node_cores = nodes.cores;
  const std::vector<int>& node_ids = nodes.ids;
  if (experts == 0) experts = static_cast<int64_t>(node_cores.size());
  std::printf("this host: %s\n", (*topo)->Describe().c_str());
  const coord::LaunchCpus plan = coord::PlanLaunchCpusFor(
      node_cores, static_cast<int>(experts), static_cast<int>(gpu_workers), coordinator, true);
  const int serving = static_cast<int>(gpu_workers) + (coordinator ? 1 : 0);  // the least tried
  if (!plan.split()) {
    std::printf(
        "no split: even %d core(s) for the GPU workers%s would leave the expert workers too "
        "few; every process then shares every core, and expert calls wait on the GPU workers' "
        "spinning threads%s\n",
        serving, coordinator ? " and the coordinator" : "",
        dropins.empty() ? "" : " (no drop-ins written)");
    return 0;
  }
  std::printf("GPU workers%s: cpus %s\n", coordinator ? " and the coordinator" : "",
              CpuList(plan.serving).c_str());
  for (size_t e = 0; e < plan.experts.size(); ++e) {
    const int node = coord::LaunchExpertNode(static_cast<int>(e),
                                             static_cast<int>(plan.experts.size()), node_ids);
    if (plan.experts.size() == node_ids.size()) {
      std::printf("expert worker of NUMA node %d (--numa_node=%d): cpus %s\n", node_ids[e],
                  node_ids[e], CpuList(plan.experts[e]).c_str());
    } else if (node >= 0) {
      std::printf("expert worker %zu of %zu, NUMA node %d (--numa_node=%d): cpus %s\n", e,
                  plan.experts.size(), node, node, CpuList(plan.experts[e]).c_str());
    } else {
      std::printf("expert worker %zu of %zu: cpus %s\n", e, plan.experts.size(),
                  CpuList(plan.experts[e]).c_str());
    }
  }
  if (dropins.empty()) {
    std::printf(
        "systemd: `systemctl edit <unit>` and add [Service] CPUAffinity=<cpus> to each "
        "splitserve-gpu-worker@ and%s splitserve-expert-worker@ unit of this host, then restart "
        "them (or --write-dropins /etc/systemd/system)\n",
        coordinator ? " splitserve-coordinator and" : "");
    return 0;
  }
  std::string command = absl::StrCat("splitserve cpus --gpu-workers ", gpu_workers);
  if (!coordinator) absl::StrAppend(&command, " --coordinator no");
  if (experts != static_cast<int64_t>(node_cores.size())) {
    absl::StrAppend(&command, " --expert-workers ", experts);
  }
  const bool one_per_node = plan.experts.size() == node_ids.size();
  const absl::StatusOr<std::vector<std::string>> written =
      coord::WriteFiles(dropins, coord::CpuDropIns(plan, coordinator, one_per_node, command));
  if (!written.ok()) {
    std::fprintf(stderr, "splitserve cpus: %s\n", std::string(written.status().message()).c_str());
    return 1;
  }
  for (const std::string& f : *written) std::printf("wrote %s\n", f.c_str());
  if (!one_per_node) {
    std::printf(
        "expert workers: not one per NUMA node, so no drop-in for them: `systemctl edit` "
        "each one with the cpus above\n");
  }
  std::printf("systemd: `systemctl daemon-reload`, then restart this host's splitserve units\n");
  return 0;
}
}  // namespace ss
