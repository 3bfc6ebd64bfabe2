// `splitserve up`'s restart rule (RestartPolicy, supervisor.h) and its run directory (RunDir,
// run_dir.h): files created without following symlinks, stale directories of dead runs removed,
// everything else left alone.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "coordinator/run_dir.h"
#include "coordinator/supervisor.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ss {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

TEST(RestartPolicyTest, DelaysDoubleToTheCapAndGiveUpAfterTheBurst) {
  RestartPolicy p;
  EXPECT_EQ(p.NextDelay(), milliseconds(500));
  EXPECT_EQ(p.NextDelay(), milliseconds(1000));
  p.OnRecovered();  // a restart that brought the cluster back starts over
  EXPECT_EQ(p.NextDelay(), milliseconds(500));
  EXPECT_EQ(p.NextDelay(), milliseconds(1000));
  EXPECT_EQ(p.NextDelay(), milliseconds(2000));
  EXPECT_EQ(p.NextDelay(), milliseconds(4000));
  EXPECT_EQ(p.NextDelay(), milliseconds(8000));
  EXPECT_LT(p.NextDelay().count(), 0);  // the sixth failure in a row: give up
  EXPECT_EQ(p.failed_in_a_row(), RestartPolicy::kBurstLimit);
}

int DeadPid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

TEST(RunDirTest, PrivateDirectoryUnderXdgRuntimeDirRemovedWhenDestroyed) {
  testing_util::TempDir xdg("rundir_xdg");
  testing_util::TempDir victim("rundir_victim");
  setenv("XDG_RUNTIME_DIR", xdg.path().c_str(), 1);
  std::string path;
  {
    absl::StatusOr<RunDir> dir = RunDir::Create();
    unsetenv("XDG_RUNTIME_DIR");
    ASSERT_TRUE(dir.ok()) << dir.status();
    path = dir->path();
    EXPECT_EQ(fs::path(path).parent_path(), fs::path(xdg.path()));
    struct stat st;
    ASSERT_EQ(lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700);
    EXPECT_EQ(testing_util::ReadAll(dir->File("pid")), std::to_string(getpid()) + "\n");
    // A name that exists, or a symlink planted there, is refused and not followed.
    EXPECT_TRUE(dir->WriteNew("cluster.json", "{}").ok());
    EXPECT_FALSE(dir->WriteNew("cluster.json", "again").ok());
    fs::create_symlink(victim / "target", dir->File("ports.json"));
    EXPECT_FALSE(dir->WriteNew("ports.json", "x").ok());
    EXPECT_FALSE(fs::exists(victim / "target"));
    { std::ofstream(victim / "kept") << "kept"; }
    fs::create_symlink(victim.path(), dir->File("link"));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(testing_util::ReadAll(victim / "kept"), "kept");  // the link went, not its target
}

TEST(RunDirTest, CleanStaleRemovesOnlyDeadRunsOfThisUser) {
  testing_util::TempDir base("rundir_base");
  testing_util::TempDir victim("rundir_victim");
  const int dead = DeadPid();
  fs::create_directory(base / "splitserve-up-dead01");
  { std::ofstream(base / "splitserve-up-dead01/pid") << dead << "\n"; }
  fs::create_symlink(victim.path(), base / "splitserve-up-dead01/link");
  { std::ofstream(victim / "kept") << "kept"; }
  fs::create_directory(base / "splitserve-up-live01");
  { std::ofstream(base / "splitserve-up-live01/pid") << getpid() << "\n"; }
  fs::create_directory(base / "splitserve-up-nopid1");
  fs::create_directory(base / "unrelated");
  { std::ofstream(base / "unrelated/pid") << dead << "\n"; }
  // A symlink with the prefix, to a directory that looks stale: neither followed nor removed.
  fs::create_directory(victim / "run");
  { std::ofstream(victim / "run/pid") << dead << "\n"; }
  fs::create_symlink(victim / "run", base / "splitserve-up-planted");

  EXPECT_GE(RunDir::CleanStale(base.path()), 1);
  EXPECT_FALSE(fs::exists(base / "splitserve-up-dead01"));
  EXPECT_TRUE(fs::exists(base / "splitserve-up-live01"));
  EXPECT_TRUE(fs::exists(base / "splitserve-up-nopid1"));
  EXPECT_TRUE(fs::exists(base / "unrelated"));
  EXPECT_TRUE(fs::is_symlink(base / "splitserve-up-planted"));
  EXPECT_TRUE(fs::exists(victim / "run/pid"));
  EXPECT_EQ(testing_util::ReadAll(victim / "kept"), "kept");
}

}  // namespace
}  // namespace ss
