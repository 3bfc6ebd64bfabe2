// `splitserve up` keeps serving when a child fails (launcher.h "Supervision"): a killed expert
// worker or GPU worker, or a stopped (hung) expert worker, is restarted and a completion succeeds
// again within a bound; meanwhile /ready is 503 and new requests get 503 with Retry-After. Its run
// directory is private (run_dir.h): under $XDG_RUNTIME_DIR, 0700, no planted symlink followed,
// stale state of killed runs removed. Every test ends with nothing left: no process, no segment,
// no run directory.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/e2e/up_process.h"
#include "tests/test_util.h"

namespace ss {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;  // NOLINT: the up_process.h helpers

constexpr auto kRecoveryBound = std::chrono::seconds(40);

// `splitserve up` on the bundled model, its run directory under `xdg`.
class Up {
 public:
  Up(const TempDir& dir, const std::string& xdg)
      : port_(FreeLoopbackPortBlock()), log_(dir / "up.log") {
    setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
    up_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{std::string(SS_BIN_DIR) + "/splitserve", "up", "--port",
                                 std::to_string(port_), "--log-dir", dir / "logs"},
        log_);
    unsetenv("XDG_RUNTIME_DIR");
  }
  int port() const { return port_; }
  bool WaitServing() { return testing_util::WaitServing(port_, *up_, log_); }
  int pid() const { return up_->pid(); }
  ChildProcess& process() { return *up_; }
  std::string log() const { return ReadLog(log_); }
  // Every child seen so far (for the leftover check).
  void Note() {
    for (int c : ChildrenOf(pid())) seen_.insert(c);
  }
  std::vector<int> seen() const { return {seen_.begin(), seen_.end()}; }
  // The run directory: the directory of the coordinator's --cluster file.
  std::string RunDirectory() {
    const int coordinator = ChildRunning(pid(), "splitserve-coordinator");
    return coordinator < 0
               ? ""
               : fs::path(FlagValue(Cmdline(coordinator), "--cluster")).parent_path().string();
  }

 private:
  const int port_;
  const std::string log_;
  std::unique_ptr<ChildProcess> up_;
  std::set<int> seen_;
};

// True once a completion succeeds, within kRecoveryBound. `*refused_with_retry_after`: some
// request meanwhile was refused with 503 and a Retry-After header (the cluster not whole).
bool Recovers(Up& up, bool* refused_with_retry_after) {
  const auto until = std::chrono::steady_clock::now() + kRecoveryBound;
  httplib::Client c("127.0.0.1", up.port());
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(10, 0);
  while (std::chrono::steady_clock::now() < until) {
    if (!up.process().Running()) return false;
    auto r = c.Post("/v1/completions", R"({"model": "tiny", "prompt": "Hi", "max_tokens": 2})",
                    "application/json");
    if (r && r->status == 200) return true;
    if (r && r->status == 503 && r->has_header("Retry-After")) *refused_with_retry_after = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// After a clean stop: exit 0, every child gone, no segment, no run directory.
void ExpectStopsClean(Up& up, const std::string& run_dir) {
  const int pid = up.pid();
  up.Note();
  EXPECT_EQ(up.process().Stop(), 0) << up.log();
  EXPECT_TRUE(AllGone(up.seen(), std::chrono::seconds(5)));
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
  EXPECT_FALSE(run_dir.empty());
  EXPECT_FALSE(fs::exists(run_dir)) << run_dir;
}

// Kills (or stops) the running child `binary` and checks that a new one takes its place and the
// service recovers.
void FailChildAndRecover(const std::string& binary, int signal) {
  TempDir dir("up_recover");
  Up up(dir, dir.path());
  ASSERT_TRUE(up.WaitServing()) << up.log();
  ASSERT_EQ(Complete(up.port()), 200);
  const std::string run_dir = up.RunDirectory();
  up.Note();
  const int victim = ChildRunning(up.pid(), binary);
  ASSERT_GT(victim, 0) << binary;
  ASSERT_EQ(kill(victim, signal), 0);
  if (signal == SIGSTOP) {
    // A stopped expert worker is a hung one: not ready within a bound (no request needed).
    bool not_ready = false;
    for (int i = 0; i < 100 && !not_ready; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      not_ready = !IsReady(up.port());
    }
    EXPECT_TRUE(not_ready) << "still ready 5 s after SIGSTOP of " << binary;
  }
  bool refused = false;
  ASSERT_TRUE(Recovers(up, &refused)) << up.log();
  EXPECT_TRUE(refused) << "no 503 with Retry-After while the cluster re-formed";
  EXPECT_TRUE(IsReady(up.port()));
  EXPECT_TRUE(AllGone({victim}, std::chrono::seconds(5))) << "the failed child was not ended";
  const int replacement = ChildRunning(up.pid(), binary);
  EXPECT_GT(replacement, 0);
  EXPECT_NE(replacement, victim);
  // The launcher notices on its next look at /ready.
  bool noticed = false;
  for (int i = 0; i < 100 && !noticed; ++i) {
    noticed = up.log().find("serving again") != std::string::npos;
    if (!noticed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(noticed) << up.log();
  ExpectStopsClean(up, run_dir);
}

TEST(LauncherRecoveryE2eTest, KilledExpertWorkerIsRestarted) {
  FailChildAndRecover("splitserve-expert-worker", SIGKILL);
}

TEST(LauncherRecoveryE2eTest, KilledGpuWorkerIsRestarted) {
  FailChildAndRecover("splitserve-gpu-worker", SIGKILL);
}

TEST(LauncherRecoveryE2eTest, StoppedExpertWorkerIsDetectedAndRestarted) {
  FailChildAndRecover("splitserve-expert-worker", SIGSTOP);
}

// A pid that no longer names a process: a child that has exited and been reaped.
int DeadPid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

// A listening socket on 127.0.0.1:`port`, or -1 when the port is taken.
int Listen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A worker that fails before the cluster was ever ready is restarted too (launcher.h): the expert
// worker's metrics port (--port + 2) is held while `up` starts, so its first start fails; once the
// port is free, a restart brings the cluster up. (A failing start used to be fatal at once.)
TEST(LauncherRecoveryE2eTest, AWorkerFailingBeforeTheFirstReadyIsRestarted) {
  TempDir dir("up_first");
  int port = 0, holder = -1;
  for (int i = 0; i < 20 && holder < 0; ++i) {
    port = FreeLoopbackPortBlock();
    holder = Listen(port + 2);
  }
  ASSERT_GE(holder, 0);
  const std::string log = dir / "up.log";
  ChildProcess up({std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port),
                   "--log-dir", dir / "logs"},
                  log);
  bool restarting = false;
  for (int i = 0; i < 400 && !restarting && up.Running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    restarting = ReadLog(log).find("restarting the workers") != std::string::npos;
  }
  close(holder);
  ASSERT_TRUE(restarting) << ReadLog(log);
  ASSERT_TRUE(WaitServing(port, up, log)) << ReadLog(log);
  EXPECT_EQ(Complete(port, 2), 200);
  const int pid = up.pid();
  EXPECT_EQ(up.Stop(), 0) << ReadLog(log);
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
}

TEST(LauncherRecoveryE2eTest, RunDirectoryIsPrivateAndStaleStateIsRemoved) {
  TempDir dir("up_rundir");
  TempDir xdg("up_xdg");
  TempDir victim("up_victim");
  // A planted symlink with the run directory's prefix, pointing at someone else's directory.
  { std::ofstream(victim / "cluster.json") << "victim\n"; }
  fs::create_symlink(victim.path(), xdg / "splitserve-up-planted");
  // A run killed outright: its directory and a segment, both named after a dead pid.
  const int dead = DeadPid();
  fs::create_directory(xdg / "splitserve-up-stale01");
  { std::ofstream(xdg / "splitserve-up-stale01/pid") << dead << "\n"; }
  const std::string stale_shm = "/splitserve-" + std::to_string(dead) + "-expert0";
  const int fd = shm_open(stale_shm.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);

  std::string killed_run_dir;
  {
    Up up(dir, xdg.path());
    ASSERT_TRUE(up.WaitServing()) << up.log();
    const std::string run_dir = up.RunDirectory();
    ASSERT_EQ(fs::path(run_dir).parent_path(), fs::path(xdg.path())) << run_dir;
    EXPECT_EQ(fs::path(run_dir).filename().string().rfind("splitserve-up-", 0), 0u) << run_dir;
    struct stat st;
    ASSERT_EQ(lstat(run_dir.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700);
    EXPECT_NE(run_dir, xdg / "splitserve-up-planted");
    EXPECT_FALSE(fs::exists(xdg / "splitserve-up-stale01"));
    EXPECT_FALSE(fs::exists("/dev/shm" + stale_shm));
    EXPECT_TRUE(fs::is_symlink(xdg / "splitserve-up-planted"));
    EXPECT_EQ(ReadAll(victim / "cluster.json"), "victim\n");
    // Killed outright: the directory stays behind, for the next start to remove.
    up.Note();
    up.process().Kill();
    EXPECT_TRUE(AllGone(up.seen(), std::chrono::seconds(15)));
    EXPECT_TRUE(fs::exists(run_dir));
    killed_run_dir = run_dir;
  }
  {
    Up up(dir, xdg.path());
    ASSERT_TRUE(up.WaitServing()) << up.log();
    EXPECT_FALSE(fs::exists(killed_run_dir)) << "a killed run's directory was not removed";
    ExpectStopsClean(up, up.RunDirectory());
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(xdg.path())) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"splitserve-up-planted"});
  EXPECT_EQ(ReadAll(victim / "cluster.json"), "victim\n");
}

}  // namespace
}  // namespace ss
