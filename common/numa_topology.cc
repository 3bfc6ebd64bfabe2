#include "common/numa_topology.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace ss {
namespace {

hwloc_topology_t Topo(void* p) { return static_cast<hwloc_topology_t>(p); }

// The calling thread's allowed CPUs, for any CPU count.
absl::StatusOr<std::vector<int>> AllowedCpus() {
  for (int ncpu = 1024; ncpu <= (1 << 20); ncpu *= 4) {
    cpu_set_t* set = CPU_ALLOC(ncpu);
    const size_t size = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      std::vector<int> cpus;
      for (int c = 0; c < ncpu; ++c)
        if (CPU_ISSET_S(c, size, set)) cpus.push_back(c);
      CPU_FREE(set);
      return cpus;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) {
      return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(err)));
    }
  }
  return absl::InternalError("sched_getaffinity: CPU mask larger than 2^20 CPUs");
}

}  // namespace

absl::StatusOr<std::unique_ptr<NumaTopology>> NumaTopology::Discover() {
  std::unique_ptr<NumaTopology> t(new NumaTopology());
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return absl::InternalError("hwloc_topology_init failed");
  t->topology_ = topo;
  if (hwloc_topology_load(topo) != 0) {
    return absl::InternalError(absl::StrCat("hwloc_topology_load: ", std::strerror(errno)));
  }
  std::vector<int> allowed;  // another machine's topology: all of its CPUs
  if (t->this_system()) {
    ASSIGN_OR_RETURN(allowed, AllowedCpus());
  }
  RETURN_IF_ERROR(t->Index(allowed));
  return t;
}

absl::StatusOr<std::unique_ptr<NumaTopology>> NumaTopology::FromSynthetic(
    const std::string& description, const std::vector<int>& allowed_cpus) {
  std::unique_ptr<NumaTopology> t(new NumaTopology());
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return absl::InternalError("hwloc_topology_init failed");
  t->topology_ = topo;
  if (hwloc_topology_set_synthetic(topo, description.c_str()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hwloc refuses the synthetic topology \"", description, "\""));
  }
  if (hwloc_topology_load(topo) != 0) {
    return absl::InternalError(absl::StrCat("hwloc_topology_load: ", std::strerror(errno)));
  }
  RETURN_IF_ERROR(t->Index(allowed_cpus));
  return t;
}

bool NumaTopology::this_system() const { return hwloc_topology_is_thissystem(Topo(topology_)); }

absl::Status NumaTopology::Index(const std::vector<int>& allowed) {
  hwloc_topology_t topo = Topo(topology_);
  hwloc_bitmap_t allowed_set = hwloc_bitmap_alloc();
  for (int c : allowed) hwloc_bitmap_set(allowed_set, static_cast<unsigned>(c));
  if (allowed.empty()) hwloc_bitmap_copy(allowed_set, hwloc_topology_get_topology_cpuset(topo));
  // Only CPUs hwloc knows (a mask may name CPUs that are offline).
  hwloc_bitmap_and(allowed_set, allowed_set, hwloc_topology_get_topology_cpuset(topo));
  for (int c = hwloc_bitmap_first(allowed_set); c >= 0; c = hwloc_bitmap_next(allowed_set, c))
    allowed_cpus_.push_back(c);

  // A core's representative PU: its lowest allowed one. Machines where hwloc reports no cores
  // (some VMs) get one "core" per PU.
  const int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  const hwloc_obj_type_t core_type = ncores > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  const int nunits = hwloc_get_nbobjs_by_type(topo, core_type);
  hwloc_bitmap_t tmp = hwloc_bitmap_alloc();
  const int nnodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nnodes; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode n;
    n.os_index = static_cast<int>(node->os_index);
    n.memory_bytes = static_cast<int64_t>(node->attr->numanode.local_memory);
    if (node->cpuset != nullptr) {
      hwloc_bitmap_and(tmp, node->cpuset, allowed_set);
      n.allowed_pus = hwloc_bitmap_weight(tmp);
      for (int u = 0; u < nunits; ++u) {
        hwloc_obj_t core = hwloc_get_obj_by_type(topo, core_type, static_cast<unsigned>(u));
        hwloc_bitmap_and(tmp, core->cpuset, allowed_set);
        hwloc_bitmap_and(tmp, tmp, node->cpuset);
        std::vector<int> pus;
        for (int c = hwloc_bitmap_first(tmp); c >= 0; c = hwloc_bitmap_next(tmp, c)) {
          pus.push_back(c);
        }
        if (!pus.empty()) n.core_pus.push_back(std::move(pus));
      }
      std::sort(n.core_pus.begin(), n.core_pus.end());  // by each core's lowest PU
      for (const std::vector<int>& pus : n.core_pus) n.core_cpus.push_back(pus.front());
    }
    nodes_.push_back(std::move(n));
  }
  hwloc_bitmap_free(tmp);
  hwloc_bitmap_free(allowed_set);
  if (nodes_.empty()) return absl::InternalError("hwloc reports no NUMA node");
  std::sort(nodes_.begin(), nodes_.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
  return absl::OkStatus();
}

NumaTopology::~NumaTopology() {
  if (topology_ != nullptr) hwloc_topology_destroy(Topo(topology_));
}

const NumaNode* NumaTopology::FindNode(int os_index) const {
  for (const NumaNode& n : nodes_)
    if (n.os_index == os_index) return &n;
  return nullptr;
}

absl::StatusOr<int> NumaTopology::ResolveNode(int requested) const {
  std::vector<int> usable;
  const NumaNode* best = nullptr;
  for (const NumaNode& n : nodes_) {
    if (n.core_cpus.empty()) continue;
    usable.push_back(n.os_index);
    if (best == nullptr || n.core_cpus.size() > best->core_cpus.size()) best = &n;
  }
  if (best == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no NUMA node has an allowed CPU (allowed CPUs: ", absl::StrJoin(allowed_cpus_, ","), ")"));
  }
  if (requested < 0) return best->os_index;
  const NumaNode* n = FindNode(requested);
  if (n == nullptr || n->core_cpus.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NUMA node ", requested, n == nullptr ? " does not exist" : " has no allowed CPU",
        "; nodes with allowed CPUs: ", absl::StrJoin(usable, ","), " (allowed CPUs ",
        absl::StrJoin(allowed_cpus_, ","), ")"));
  }
  return requested;
}

std::string NumaTopology::Describe() const {
  std::vector<std::string> parts;
  for (const NumaNode& n : nodes_) {
    parts.push_back(absl::StrFormat("node %d: %d cores (cpus %s; %d PUs allowed), %.1f GiB",
                                    n.os_index, static_cast<int>(n.core_cpus.size()),
                                    absl::StrJoin(n.core_cpus, ","), n.allowed_pus,
                                    static_cast<double>(n.memory_bytes) / (1 << 30)));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace ss
