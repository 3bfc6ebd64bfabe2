#include "cpu_expert_worker/numa.h"

#include <hwloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/int_math.h"
#include "spdlog/spdlog.h"

namespace ss::expert {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

hwloc_topology_t Topo(void* p) { return static_cast<hwloc_topology_t>(p); }

std::array<std::atomic<int64_t>, 1> g_refusals{};

}  // namespace

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
