#include "cpu_expert_worker/numa.h"

#include <hwloc.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/int_math.h"
#include "spdlog/spdlog.h"

namespace ss::expert {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

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

std::array<std::atomic<int64_t>, 1> g_refusals{};

}  // namespace

absl::StatusOr<std::unique_ptr<NumaTopology>> NumaTopology::Discover() {
  std::unique_ptr<NumaTopology> t(new NumaTopology());
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return absl::InternalError("hwloc_topology_init failed");
  t->topology_ = topo;
  if (hwloc_topology_load(topo) != 0) {
    return absl::InternalError(absl::StrCat("hwloc_topology_load: ", std::strerror(errno)));
  }
  auto allowed = AllowedCpus();
  if (!allowed.ok()) return allowed.status();

  hwloc_bitmap_t allowed_set = hwloc_bitmap_alloc();
  for (int c : *allowed) hwloc_bitmap_set(allowed_set, static_cast<unsigned>(c));
  // Only CPUs hwloc knows (a mask may name CPUs that are offline).
  hwloc_bitmap_and(allowed_set, allowed_set, hwloc_topology_get_topology_cpuset(topo));
  for (int c = hwloc_bitmap_first(allowed_set); c >= 0; c = hwloc_bitmap_next(allowed_set, c))
    t->allowed_cpus_.push_back(c);

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
    t->nodes_.push_back(std::move(n));
  }
  hwloc_bitmap_free(tmp);
  hwloc_bitmap_free(allowed_set);
  if (t->nodes_.empty()) return absl::InternalError("hwloc reports no NUMA node");
  std::sort(t->nodes_.begin(), t->nodes_.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
  return t;
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

NodeMemory::~NodeMemory() { Release(); }

NodeMemory::NodeMemory(NodeMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      bound_(std::exchange(o.bound_, false)) {}

NodeMemory& NodeMemory::operator=(NodeMemory&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    bound_ = std::exchange(o.bound_, false);
  }
  return *this;
}

void NodeMemory::Release() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  bound_ = false;
}

absl::StatusOr<NodeMemory> AllocateNodeMemory(const NumaTopology* topology, size_t bytes,
                                              int node) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateNodeMemory: 0 bytes");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t len = RoundUp(bytes, page);
  // Large ranges start on a huge-page boundary so transparent huge pages can back all of them.
  const bool huge = len >= 2 * kHugePage;
  if (huge) len = RoundUp(len, kHugePage);
  const size_t map_len = huge ? len + kHugePage : len;
  void* p = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", map_len, " bytes: ", std::strerror(errno)));
  }
  uint8_t* base = static_cast<uint8_t*>(p);
  if (huge) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(base);
    uint8_t* aligned = base + ((kHugePage - a % kHugePage) % kHugePage);
    if (aligned > base) ::munmap(base, static_cast<size_t>(aligned - base));
    const size_t tail = static_cast<size_t>(base + map_len - (aligned + len));
    if (tail > 0) ::munmap(aligned + len, tail);
    base = aligned;
    ::madvise(base, len, MADV_HUGEPAGE);  // advisory: refused or unavailable THP is fine
  }
  NodeMemory m;
  m.data_ = base;
  m.size_ = len;
  if (topology != nullptr && node >= 0) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_bitmap_only(set, static_cast<unsigned>(node));
    const int rc =
        hwloc_set_area_membind(Topo(topology->hwloc()), base, len, set, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
    const int err = errno;
    hwloc_bitmap_free(set);
    if (rc == 0) {
      m.bound_ = true;
    } else {
      WarnOnce(
          Refusal::kMemoryBinding,
          absl::StrCat("binding memory to NUMA node ", node, " was refused (", std::strerror(err),
                       "); continuing with first-touch placement by the node's threads"));
    }
  }
  return m;
}

bool WarnOnce(Refusal kind, const std::string& message) {
  if (g_refusals[static_cast<int>(kind)].fetch_add(1) != 0) return false;
  spdlog::warn(message + " (reported once per process)");
  return true;
}

int64_t RefusalCount(Refusal kind) { return g_refusals[static_cast<int>(kind)].load(); }

int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long size = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE) : 0;
}

}  // namespace ss::expert
