#include "cpu_expert_worker/numa.h"

#include <fcntl.h>
#include <hwloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/int_math.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace ss::expert {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

hwloc_topology_t Topo(void* p) { return static_cast<hwloc_topology_t>(p); }

std::array<std::atomic<int64_t>, 1> g_refusals{};

constexpr char kThpDir[] = "/sys/kernel/mm/transparent_hugepage/";

// The whole of a small text file, or "" if unreadable.
std::string ReadSmallFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return text;
}

// The bracketed word of a sysfs choice ("always [madvise] never" -> "madvise"), or "".
std::string Chosen(const std::string& text) {
  const size_t open = text.find('[');
  const size_t close = open == std::string::npos ? open : text.find(']', open);
  return close == std::string::npos ? "" : text.substr(open + 1, close - open - 1);
}

}  // namespace

absl::StatusOr<WorkerPlacement> PlaceWorker(const NumaTopology& topology, int numa_node,
                                            int threads) {
  absl::StatusOr<int> node = topology.ResolveNode(numa_node);
  if (!node.ok()) {
    return absl::Status(node.status().code(),
                        absl::StrCat("--numa_node: ", node.status().message()));
  }
  const std::vector<int>& cores = topology.FindNode(*node)->core_cpus;
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads ", threads, ": use 0 for every physical core of the node"));
  }
  if (threads == 0) threads = static_cast<int>(cores.size());
  if (threads > static_cast<int>(cores.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--threads ", threads, " exceeds the ", cores.size(), " physical cores of NUMA node ",
        *node, " in the allowed CPU set (one thread per core)"));
  }
  return WorkerPlacement{*node, std::vector<int>(cores.begin(), cores.begin() + threads)};
}

NodeMemory::~NodeMemory() { Release(); }

NodeMemory::NodeMemory(NodeMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      bound_(std::exchange(o.bound_, false)),
      shm_name_(std::exchange(o.shm_name_, std::string())),
      shm_dev_(std::exchange(o.shm_dev_, 0)),
      shm_ino_(std::exchange(o.shm_ino_, 0)) {}

NodeMemory& NodeMemory::operator=(NodeMemory&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    bound_ = std::exchange(o.bound_, false);
    shm_name_ = std::exchange(o.shm_name_, std::string());
    shm_dev_ = std::exchange(o.shm_dev_, 0);
    shm_ino_ = std::exchange(o.shm_ino_, 0);
  }
  return *this;
}

void NodeMemory::Release() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (!shm_name_.empty()) {
    // Unlink only the segment we created (a reclaim elsewhere could have replaced the name).
    const int fd = ::shm_open(shm_name_.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
      struct stat st;
      const bool ours = ::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == shm_ino_ &&
                        static_cast<uint64_t>(st.st_dev) == shm_dev_;
      ::close(fd);
      if (ours) ::shm_unlink(shm_name_.c_str());
    }
  }
  data_ = nullptr;
  size_ = 0;
  bound_ = false;
  shm_name_.clear();
}

int64_t NodeMemory::HugePageBytes() const {
  if (data_ == nullptr) return 0;
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data_), hi = lo + size_;
  bool inside = false;
  int64_t kb = 0;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long start = 0, end = 0;
    long v = 0;
    if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2 && std::strchr(line, ':') != nullptr &&
        std::strchr(line, '-') < std::strchr(line, ' ')) {
      inside = start >= lo && end <= hi;
    } else if (inside && (std::sscanf(line, "AnonHugePages: %ld kB", &v) == 1 ||
                          std::sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1)) {
      kb += v;
    }
  }
  std::fclose(f);
  return kb * 1024;
}

absl::StatusOr<NodeMemory> AllocateNodeMemory(const NumaTopology* topology, size_t bytes,
                                              int node) {
  NodeMemoryOptions o;
  o.topology = topology;
  o.node = node;
  return AllocateNodeMemory(bytes, o);
}

absl::StatusOr<NodeMemory> AllocateNodeMemory(size_t bytes, const NodeMemoryOptions& o) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateNodeMemory: 0 bytes");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t len = RoundUp(bytes, page);
  // Large ranges start on a huge-page boundary so transparent huge pages can back all of them.
  const bool huge = len >= 2 * kHugePage;
  if (huge) len = RoundUp(len, kHugePage);
  const size_t map_len = huge ? len + kHugePage : len;
  NodeMemory m;
  int fd = -1;
  if (!o.shm_name.empty()) {
    ASSIGN_OR_RETURN(fd, CreateShmSegment(o.shm_name, o.shm_kind, /*reclaim_stale=*/true));
    m.shm_name_ = o.shm_name;  // from here on, m's destructor unlinks it
    struct stat st;
    struct statvfs vfs;
    if (::fstat(fd, &st) != 0 || ::fstatvfs(fd, &vfs) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("fstat ", o.shm_name, ": ", std::strerror(err)));
    }
    m.shm_dev_ = st.st_dev;
    m.shm_ino_ = st.st_ino;
    // tmpfs allocates on first touch and SIGBUSes when full: refuse up front instead.
    const uint64_t room = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (room < len) {
      ::close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("shm segment ", o.shm_name, ": ", len, " bytes wanted, /dev/shm has ", room,
                       " free (its tmpfs size limits shared memory)"));
    }
    if (::ftruncate(fd, static_cast<off_t>(len)) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("ftruncate ", o.shm_name, " to ", len, ": ", std::strerror(err)));
    }
  }
  // Anonymous: the range itself. Shared: a reservation that the segment is mapped over.
  void* p = ::mmap(nullptr, map_len, fd < 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (fd < 0 ? 0 : MAP_NORESERVE), -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", map_len, " bytes: ", std::strerror(err)));
  }
  uint8_t* base = static_cast<uint8_t*>(p);
  if (huge) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(base);
    uint8_t* aligned = base + ((kHugePage - a % kHugePage) % kHugePage);
    if (aligned > base) ::munmap(base, static_cast<size_t>(aligned - base));
    const size_t tail = static_cast<size_t>(base + map_len - (aligned + len));
    if (tail > 0) ::munmap(aligned + len, tail);
    base = aligned;
  }
  if (fd >= 0) {
    void* q = ::mmap(base, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (q == MAP_FAILED) {
      ::munmap(base, len);
      return absl::ResourceExhaustedError(absl::StrCat("mmap of shm segment ", o.shm_name, " (",
                                                       len, " bytes): ", std::strerror(err)));
    }
  }
  m.data_ = base;
  m.size_ = len;
  if (huge) ::madvise(base, len, MADV_HUGEPAGE);  // advisory: refused or unavailable THP is fine
  if (o.topology != nullptr && o.node >= 0 && !o.topology->this_system()) {
    WarnOnce(Refusal::kMemoryBinding,
             absl::StrCat("memory is not bound to NUMA node ", o.node,
                          ": the topology is not this machine's (an hwloc synthetic or XML "
                          "topology); continuing with first-touch placement"));
  } else if (o.topology != nullptr && o.node >= 0) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    hwloc_bitmap_only(set, static_cast<unsigned>(o.node));
    const int rc =
        hwloc_set_area_membind(Topo(o.topology->hwloc()), base, len, set, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
    const int err = errno;
    hwloc_bitmap_free(set);
    if (rc == 0) {
      m.bound_ = true;
    } else {
      WarnOnce(
          Refusal::kMemoryBinding,
          absl::StrCat("binding memory to NUMA node ", o.node, " was refused (", std::strerror(err),
                       "); continuing with first-touch placement by the node's threads"));
    }
  }
  if (fd >= 0) {
    // The owner first, so a crash from here on leaves a reclaimable leftover (shm_segment.h).
    auto* owner = reinterpret_cast<ShmOwnerPrefix*>(base);
    owner->owner_pid = static_cast<int32_t>(::getpid());
    owner->owner_start_time = ProcessStartTime(owner->owner_pid);
  }
  return m;
}

bool WarnOnce(Refusal kind, const std::string& message) {
  if (g_refusals[static_cast<int>(kind)].fetch_add(1) != 0) return false;
  spdlog::warn(message + " (reported once per process)");
  return true;
}

int64_t RefusalCount(Refusal kind) { return g_refusals[static_cast<int>(kind)].load(); }

HugePagePolicy AnonymousHugePagePolicyOf(const std::string& enabled) {
  const std::string word = Chosen(enabled);
  if (word.empty()) return {"unknown", false, ""};
  HugePagePolicy p{"transparent_hugepage/enabled=" + word, word == "always" || word == "madvise",
                   ""};
  if (!p.allows) p.remedy = absl::StrCat("echo madvise > ", kThpDir, "enabled");
  return p;
}

HugePagePolicy SharedHugePagePolicyOf(const std::string& shmem_enabled, const std::string& mounts) {
  const std::string forced = Chosen(shmem_enabled);
  if (forced == "deny" || forced == "force") {
    return {"shmem_enabled=" + forced, forced == "force",
            forced == "deny" ? absl::StrCat("echo advise > ", kThpDir,
                                            "shmem_enabled; mount -o remount,huge=advise /dev/shm")
                             : ""};
  }
  // The last /dev/shm line of the mount table is the mount a path lookup reaches.
  std::string options;
  bool found = false;
  for (const absl::string_view line : absl::StrSplit(mounts, '\n')) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    if (f.size() >= 4 && f[1] == "/dev/shm") {
      options = std::string(f[3]);
      found = true;
    }
  }
  if (!found) return {"unknown", false, ""};
  std::string huge = "never";  // the kernel lists huge= only when it is not never
  for (absl::string_view o : absl::StrSplit(options, ',')) {
    if (absl::ConsumePrefix(&o, "huge=")) huge = std::string(o);
  }
  HugePagePolicy p{"/dev/shm huge=" + huge,
                   huge == "always" || huge == "within_size" || huge == "advise", ""};
  if (!p.allows) p.remedy = "mount -o remount,huge=advise /dev/shm";
  return p;
}

HugePagePolicy AnonymousHugePagePolicy() {
  return AnonymousHugePagePolicyOf(ReadSmallFile(absl::StrCat(kThpDir, "enabled")));
}

HugePagePolicy SharedHugePagePolicy() {
  return SharedHugePagePolicyOf(ReadSmallFile(absl::StrCat(kThpDir, "shmem_enabled")),
                                ReadSmallFile("/proc/self/mounts"));
}

int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long size = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE) : 0;
}

}  // namespace ss::expert
