// The pinned thread pool and the NUMA topology it is built from:
//  * every index runs exactly once, for many sizes and pool sizes, each worker id in range;
//  * RunOnEachWorker reaches every worker once, on distinct threads;
//  * nested use of the same pool is refused (no deadlock), another pool nests fine;
//  * many short calls, calls after sleeping, concurrent callers: no deadlock, no lost work;
//  * a task may wait for a lower index of its job (WaitInTask);
//  * pinning refused (a CPU outside the allowed set) -> one warning, the pool still works;
//  * pinned workers run on their CPUs; topology lists each physical core once;
//  * node memory: bound where the kernel allows, unbound (and usable) where it refuses.
// A machine with one NUMA node exercises binding to that node and refusal for a missing node,
// not placement across two real nodes.
#include "common/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/shm_segment.h"
#include "cpu_expert_worker/numa.h"

namespace ss::expert {
namespace {

std::unique_ptr<ThreadPool> MakePool(int n, int spin_us = 200, std::vector<int> cpus = {}) {
  ThreadPoolOptions o;
  o.num_threads = n;
  o.spin_us = spin_us;
  o.cpus = std::move(cpus);
  auto p = ThreadPool::Create(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    auto pool = MakePool(threads);
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(pool->size(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> bad_worker{false};
      ASSERT_TRUE(pool->ParallelFor(n,
                                    [&](int64_t i, int w) {
                                      hits[i].fetch_add(1);
                                      if (w < 0 || w >= threads) bad_worker = true;
                                    })
                      .ok());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
      EXPECT_FALSE(bad_worker);
    }
  }
}

TEST(ThreadPool, RunOnEachWorkerReachesEveryWorkerOnce) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  std::vector<std::atomic<int>> hits(4);
  std::vector<std::thread::id> ids(4);
  ASSERT_TRUE(pool->RunOnEachWorker([&](int w) {
                    hits[w].fetch_add(1);
                    ids[w] = std::this_thread::get_id();
                  })
                  .ok());
  std::set<std::thread::id> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), 4u);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_EQ(ids[0], std::this_thread::get_id());  // worker 0 is the caller
}

TEST(ThreadPool, NestedUseOfTheSamePoolIsRefused) {
  auto pool = MakePool(3);
  auto other = MakePool(2);
  ASSERT_NE(pool, nullptr);
  ASSERT_NE(other, nullptr);
  std::atomic<int> refused{0}, inner_runs{0}, outer_runs{0};
  ASSERT_TRUE(
      pool->ParallelFor(12,
                        [&](int64_t, int) {
                          outer_runs.fetch_add(1);
                          const absl::Status st = pool->ParallelFor(4, [&](int64_t, int) {});
                          if (st.code() == absl::StatusCode::kFailedPrecondition)
                            refused.fetch_add(1);
                          if (pool->RunOnEachWorker([](int) {}).code() ==
                              absl::StatusCode::kFailedPrecondition) {
                            refused.fetch_add(1);
                          }
                          // A different pool may be used from inside a task.
                          EXPECT_TRUE(
                              other->ParallelFor(3, [&](int64_t, int) { inner_runs++; }).ok());
                        })
          .ok());
  EXPECT_EQ(outer_runs.load(), 12);
  EXPECT_EQ(refused.load(), 24);
  EXPECT_EQ(inner_runs.load(), 36);
  // Still serving afterwards.
  std::atomic<int> after{0};
  EXPECT_TRUE(pool->ParallelFor(5, [&](int64_t, int) { after++; }).ok());
  EXPECT_EQ(after.load(), 5);
}

TEST(ThreadPool, ManyShortCallsDoNotDeadlock) {
  // spin 0: (almost) every call goes through the futex sleep/wake path. 3 threads: more than
  // the 2-core development machine has, so spinning waiters must yield to the thread they wait
  // for.
  for (int spin_us : {0, 20, 200}) {
    auto pool = MakePool(3, spin_us);
    ASSERT_NE(pool, nullptr);
    int64_t expect = 0;
    std::atomic<int64_t> sum{0};
    for (int call = 0; call < 20000; ++call) {
      const int64_t n = call % 5;  // 0..4: no-op, inline and shared paths
      ASSERT_TRUE(pool->ParallelFor(n, [&](int64_t i, int) { sum.fetch_add(i + 1); }).ok());
      expect += n * (n + 1) / 2;
    }
    EXPECT_EQ(sum.load(), expect) << "spin_us " << spin_us;
  }
}

// The order contract (thread_pool.h "Order"): every index waits for the one below it to finish
// (the longest chain there is), with grains of 1 and of many indices and more threads than the
// 2-core development machine has; a wait on a lower index always ends. Dropping the in-order
// hand-out or running a grain out of order would hang this test.
TEST(ThreadPool, AnIndexMayWaitForALowerOne) {
  for (int threads : {1, 2, 3, 5}) {
    auto pool = MakePool(threads, /*spin_us=*/20);
    ASSERT_NE(pool, nullptr);
    for (int64_t n : {2, 9, 64, 1000}) {
      std::vector<std::atomic<int>> done(n);
      std::atomic<int64_t> out_of_order{0};
      ASSERT_TRUE(pool->ParallelFor(n,
                                    [&](int64_t i, int) {
                                      if (i > 0) {
                                        ThreadPool::WaitInTask(
                                            [&] { return done[i - 1].load() == 1; });
                                      }
                                      if (i > 0 && done[i - 1].load() != 1) ++out_of_order;
                                      done[i].store(1);
                                    })
                      .ok());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(done[i].load(), 1) << threads << " " << n;
      EXPECT_EQ(out_of_order.load(), 0);
    }
  }
}

// on_drained runs exactly once per job, after every index has started (on one thread: just
// before the last), and before ParallelFor returns; n <= 0 runs it alone.
TEST(ThreadPool, OnDrainedRunsOnceWhenEveryIndexIsHandedOut) {
  for (int threads : {1, 2, 3, 5}) {
    auto pool = MakePool(threads, /*spin_us=*/20);
    ASSERT_NE(pool, nullptr);
    for (int64_t n : {0, 1, 2, 7, 64, 1000}) {
      std::atomic<int64_t> started{0};
      std::atomic<int> drained{0};
      std::atomic<int64_t> started_at_drain{-1};
      ASSERT_TRUE(pool->ParallelFor(
                          n, [&](int64_t, int) { started.fetch_add(1); },
                          [&] {
                            drained.fetch_add(1);
                            started_at_drain.store(started.load());
                          })
                      .ok());
      EXPECT_EQ(drained.load(), 1) << threads << " threads, n " << n;
      // Every index was handed out: at most a grain per worker (thread_pool.cc: n / (8 x
      // threads), at least 1) has not started yet; on one thread exactly the last index.
      const int64_t grain = std::max<int64_t>(1, n / (8 * threads));
      if (threads == 1 || n == 1) {
        EXPECT_EQ(started_at_drain.load(), std::max<int64_t>(0, n - 1));
      } else {
        EXPECT_GE(started_at_drain.load(), n - threads * grain) << threads << " threads, n " << n;
      }
    }
  }
}

// ParallelForAhead's `next` is the index the same worker runs right after (or -1), every index
// runs once, and on a long job a worker knows its next grain before its current one ends.
TEST(ThreadPool, ParallelForAheadNamesEachWorkersNextIndex) {
  int64_t across_grains = 0;
  for (int threads : {1, 2, 3, 5}) {
    auto pool = MakePool(threads, /*spin_us=*/20);
    ASSERT_NE(pool, nullptr);
    for (int64_t n : {1, 2, 7, 64, 1000}) {
      std::vector<std::vector<std::pair<int64_t, int64_t>>> seq(threads);
      std::unique_ptr<std::atomic<int>[]> runs(new std::atomic<int>[n]());
      int drained = 0;
      ASSERT_TRUE(pool->ParallelForAhead(
                          n,
                          [&](int64_t i, int64_t next, int worker) {
                            seq[worker].push_back({i, next});
                            runs[i].fetch_add(1);
                          },
                          [&] { ++drained; })
                      .ok());
      EXPECT_EQ(drained, 1);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
      for (int w = 0; w < threads; ++w) {
        for (size_t j = 0; j < seq[w].size(); ++j) {
          const int64_t next = seq[w][j].second;
          const int64_t actual = j + 1 < seq[w].size() ? seq[w][j + 1].first : -1;
          if (next != -1) {
            EXPECT_EQ(next, actual) << threads << " threads, n " << n << ", worker " << w;
          }
          // The last index of a grain (grains: thread_pool.cc, n / (8 x threads) from 0).
          const int64_t i = seq[w][j].first, grain = std::max<int64_t>(1, n / (8 * threads));
          across_grains += threads > 1 && n > 1 && next != -1 && (i + 1) % grain == 0;
        }
        if (!seq[w].empty()) {
          EXPECT_EQ(seq[w].back().second, -1);
        }
      }
    }
  }
  EXPECT_GT(across_grains, 0);  // grains were taken ahead somewhere
}

TEST(ThreadPool, CallsAfterWorkersFellAsleep) {
  auto pool = MakePool(3, /*spin_us=*/50);
  ASSERT_NE(pool, nullptr);
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(i % 2 ? 300 : 10));
    std::atomic<int> hits{0};
    ASSERT_TRUE(pool->ParallelFor(9, [&](int64_t, int) { hits++; }).ok());
    ASSERT_EQ(hits.load(), 9);
  }
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  auto pool = MakePool(2, 10);
  ASSERT_NE(pool, nullptr);
  std::atomic<int64_t> sum{0};
  std::atomic<int> active{0}, overlap{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        EXPECT_TRUE(pool->ParallelFor(4,
                                      [&](int64_t j, int) {
                                        sum.fetch_add(j);
                                        if (j == 0 && active.fetch_add(1) != 0) overlap++;
                                        if (j == 0) active.fetch_sub(1);
                                      })
                        .ok());
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 3 * 2000 * 6);
  EXPECT_EQ(overlap.load(), 0);
}

TEST(ThreadPool, RejectsBadOptions) {
  ThreadPoolOptions o;
  o.num_threads = 0;
  EXPECT_EQ(ThreadPool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.num_threads = 2;
  o.cpus = {0};
  EXPECT_EQ(ThreadPool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.cpus = {};
  o.spin_us = -1;
  EXPECT_EQ(ThreadPool::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// CPU 4000 is not in any allowed set here: the kernel refuses the pin with EINVAL, which is
// how a container's cpuset refusal looks to the pool.
TEST(ThreadPool, PinningRefusedStillWorks) {
  auto pool = MakePool(3, 50, {4000, 4001, -1});
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->workers_pinned());
  EXPECT_GE(ThreadPool::pin_refusals(), 1);
  bool caller_pinned = true;
  std::thread([&] { caller_pinned = pool->PinCallingThread(); }).join();
  EXPECT_FALSE(caller_pinned);
  std::atomic<int> hits{0};
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE(pool->ParallelFor(7, [&](int64_t, int) { hits++; }).ok());
  EXPECT_EQ(hits.load(), 700);
}

// ---------------------------------------------------------------------------------------------
// Topology.

// (package, core) of an OS CPU from sysfs, or {-1, -1}.
std::pair<int, int> CoreOf(int cpu) {
  auto read = [cpu](const char* f) {
    std::ifstream in("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + f);
    int v = -1;
    in >> v;
    return v;
  };
  return {read("physical_package_id"), read("core_id")};
}

TEST(NumaTopology, OneCpuPerPhysicalCoreWithinTheAllowedSet) {
  auto topo = NumaTopology::Discover();
  ASSERT_TRUE(topo.ok()) << topo.status();
  const NumaTopology& t = **topo;
  ASSERT_FALSE(t.nodes().empty());
  ASSERT_FALSE(t.allowed_cpus().empty());
  const std::set<int> allowed(t.allowed_cpus().begin(), t.allowed_cpus().end());
  std::set<std::pair<int, int>> cores;
  int total = 0;
  for (const NumaNode& n : t.nodes()) {
    EXPECT_LE(static_cast<int>(n.core_cpus.size()), n.allowed_pus);
    // core_pus: each core's allowed hardware threads, its representative first, the node's
    // allowed PUs each exactly once.
    ASSERT_EQ(n.core_pus.size(), n.core_cpus.size());
    int pus = 0;
    for (size_t i = 0; i < n.core_pus.size(); ++i) {
      ASSERT_FALSE(n.core_pus[i].empty());
      EXPECT_EQ(n.core_pus[i].front(), n.core_cpus[i]);
      for (int pu : n.core_pus[i]) {
        EXPECT_TRUE(allowed.count(pu)) << pu;
        const auto core = CoreOf(pu);
        if (core.second >= 0) {
          EXPECT_EQ(core, CoreOf(n.core_cpus[i])) << "cpu " << pu;
        }
      }
      pus += static_cast<int>(n.core_pus[i].size());
    }
    EXPECT_EQ(pus, n.allowed_pus);
    for (int cpu : n.core_cpus) {
      EXPECT_TRUE(allowed.count(cpu)) << cpu;
      const auto core = CoreOf(cpu);
      if (core.second >= 0) {
        EXPECT_TRUE(cores.insert(core).second) << "two threads on the core of cpu " << cpu;
      }
      ++total;
    }
  }
  EXPECT_GE(total, 1);
  std::printf("topology: %s\n", t.Describe().c_str());
  auto node = t.ResolveNode(-1);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_NE(t.FindNode(*node), nullptr);
  EXPECT_EQ(*t.ResolveNode(*node), *node);
  const auto missing = t.ResolveNode(99);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("99"), std::string::npos) << missing.status();
}

TEST(NumaTopology, PinnedWorkersRunOnTheirCores) {
  auto topo = NumaTopology::Discover();
  ASSERT_TRUE(topo.ok()) << topo.status();
  const NumaNode* node = (*topo)->FindNode(*(*topo)->ResolveNode(-1));
  const std::vector<int>& cpus = node->core_cpus;
  auto pool = MakePool(static_cast<int>(cpus.size()), 200, cpus);
  ASSERT_NE(pool, nullptr);
  if (!pool->workers_pinned()) GTEST_SKIP() << "pinning is refused on this machine";
  // The caller's share runs on a thread of our own, so the test process keeps its affinity.
  std::thread([&] {
    ASSERT_TRUE(pool->PinCallingThread());
    std::vector<int> seen(cpus.size(), -1);
    ASSERT_TRUE(pool->RunOnEachWorker([&](int w) { seen[w] = sched_getcpu(); }).ok());
    for (size_t w = 0; w < cpus.size(); ++w) EXPECT_EQ(seen[w], cpus[w]) << "worker " << w;
  }).join();
}

TEST(NodeMemory, BoundWhereAllowedUnboundAndUsableWhereRefused) {
  auto topo = NumaTopology::Discover();
  ASSERT_TRUE(topo.ok()) << topo.status();
  const int node = *(*topo)->ResolveNode(-1);
  const int64_t refusals_before = RefusalCount(Refusal::kMemoryBinding);
  auto m = AllocateNodeMemory(topo->get(), 5 << 20, node);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GE(m->size(), size_t{5} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % 4096, 0u);
  std::memset(m->data(), 1, m->size());
  if (!m->bound()) {
    EXPECT_GT(RefusalCount(Refusal::kMemoryBinding), refusals_before);
    std::printf("binding to node %d is refused here: the refusal path ran\n", node);
  }
  // A node that does not exist: the kernel refuses; the memory comes back unbound and usable.
  auto missing = AllocateNodeMemory(topo->get(), 1 << 20, 63);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->bound());
  EXPECT_GE(RefusalCount(Refusal::kMemoryBinding), 1);
  std::memset(missing->data(), 7, missing->size());
  EXPECT_EQ(missing->data()[12345], 7);
  // No topology: plain memory. Zero bytes: an error. Moves transfer ownership.
  auto plain = AllocateNodeMemory(nullptr, 100, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->bound());
  EXPECT_EQ(AllocateNodeMemory(nullptr, 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
  NodeMemory moved = std::move(*missing);
  EXPECT_EQ(missing->data(), nullptr);
  EXPECT_EQ(moved.data()[12345], 7);
}

// A shared segment: created 0600 with this process as its owner, the same binding rules, counted
// in the resident set once touched, unlinked by its owner alone (a move hands the name over).
TEST(NodeMemory, SharedSegmentIsOwnedAndUnlinkedByItsHolder) {
  const std::string name = "/ss-test-nodemem-" + std::to_string(::getpid());
  const std::string path = "/dev/shm" + name;
  auto topo = NumaTopology::Discover();
  ASSERT_TRUE(topo.ok()) << topo.status();
  NodeMemoryOptions o;
  o.topology = topo->get();
  o.node = *(*topo)->ResolveNode(-1);
  o.shm_name = name;
  o.shm_kind = {0x5453455445444f4eull, "test segment"};
  auto m = AllocateNodeMemory(6 << 20, o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->shm_name(), name);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % (2 << 20), 0u);  // huge-page aligned
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<size_t>(st.st_size), m->size());
  const auto* owner = reinterpret_cast<const ShmOwnerPrefix*>(m->data());
  EXPECT_EQ(owner->magic, 0u);  // the caller publishes
  EXPECT_EQ(owner->owner_pid, ::getpid());
  EXPECT_EQ(owner->owner_start_time, ProcessStartTime(::getpid()));
  const int64_t before = ResidentBytes();
  std::memset(m->data() + 4096, 3, m->size() - 4096);
  EXPECT_GE(ResidentBytes() - before, 5 << 20);
  EXPECT_GE(m->HugePageBytes(), 0);
  // The name is taken while its owner lives.
  EXPECT_EQ(AllocateNodeMemory(1 << 20, o).status().code(), absl::StatusCode::kAlreadyExists);
  NodeMemory moved = std::move(*m);
  *m = NodeMemory();  // releasing the moved-from holder unlinks nothing
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(moved.data()[4096], 3);
  moved = NodeMemory();
  EXPECT_NE(::stat(path.c_str(), &st), 0);
  // More than /dev/shm holds: ResourceExhausted, nothing left behind.
  struct statvfs vfs;
  ASSERT_EQ(::statvfs("/dev/shm", &vfs), 0);
  auto huge = AllocateNodeMemory(static_cast<size_t>(vfs.f_blocks) * vfs.f_frsize * 2, o);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

// The kernel settings that decide huge pages: anonymous memory by transparent_hugepage/enabled,
// /dev/shm segments by that mount's huge= option (shmem_enabled only where deny or force).
TEST(HugePagePolicy, ReadsTheSettingThatDecidesEachKind) {
  EXPECT_EQ(AnonymousHugePagePolicyOf("always [madvise] never\n").setting,
            "transparent_hugepage/enabled=madvise");
  EXPECT_TRUE(AnonymousHugePagePolicyOf("[always] madvise never\n").allows);
  const HugePagePolicy never = AnonymousHugePagePolicyOf("always madvise [never]\n");
  EXPECT_FALSE(never.allows);
  EXPECT_EQ(never.remedy, "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled");
  EXPECT_EQ(AnonymousHugePagePolicyOf("").setting, "unknown");

  const std::string shmem = "always within_size advise [never] deny force\n";
  const std::string mounts =
      "proc /proc proc rw 0 0\n"
      "tmpfs /dev/shm tmpfs rw,nosuid,size=1024k 0 0\n"
      "tmpfs /dev/shm tmpfs rw,relatime,size=24683568k,huge=within_size 0 0\n";
  // The last /dev/shm mount counts, whatever shmem_enabled says short of deny/force.
  const HugePagePolicy within = SharedHugePagePolicyOf(shmem, mounts);
  EXPECT_EQ(within.setting, "/dev/shm huge=within_size");
  EXPECT_TRUE(within.allows);
  EXPECT_TRUE(within.remedy.empty());
  // No huge= option: never, and the remount that allows it.
  const HugePagePolicy plain =
      SharedHugePagePolicyOf("always within_size [advise] never deny force\n",
                             "tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n");
  EXPECT_EQ(plain.setting, "/dev/shm huge=never");
  EXPECT_FALSE(plain.allows);
  EXPECT_EQ(plain.remedy, "mount -o remount,huge=advise /dev/shm");
  const HugePagePolicy forced =
      SharedHugePagePolicyOf("always within_size advise never deny [force]\n", mounts);
  EXPECT_EQ(forced.setting, "shmem_enabled=force");
  EXPECT_TRUE(forced.allows);
  const HugePagePolicy denied =
      SharedHugePagePolicyOf("always within_size advise never [deny] force\n", mounts);
  EXPECT_FALSE(denied.allows);
  EXPECT_NE(denied.remedy.find("shmem_enabled"), std::string::npos);
  EXPECT_EQ(SharedHugePagePolicyOf(shmem, "proc /proc proc rw 0 0\n").setting, "unknown");
  // This machine's: whatever they are, they are read.
  std::printf("here: %s; %s\n", AnonymousHugePagePolicy().setting.c_str(),
              SharedHugePagePolicy().setting.c_str());
}

TEST(ResidentBytes, TracksTouchedMemory) {
  const int64_t before = ResidentBytes();
  ASSERT_GT(before, 0);
  auto m = AllocateNodeMemory(nullptr, 64 << 20, -1);
  ASSERT_TRUE(m.ok());
  const int64_t untouched = ResidentBytes();
  std::memset(m->data(), 1, m->size());
  const int64_t touched = ResidentBytes();
  EXPECT_LT(untouched - before, 8 << 20);
  EXPECT_GE(touched - untouched, 60 << 20);
}

}  // namespace
}  // namespace ss::expert
