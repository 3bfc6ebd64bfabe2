// `splitserve up` as a user runs it (issue 6 item 7): the bundled tiny model, the README's curl
// example, a clean stop on SIGTERM that leaves no child process and no shared-memory segment,
// and the same when the launcher is killed outright (its children die with it).
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/up_process.h"
#include "tests/test_util.h"

namespace ss {
namespace {

using json = nlohmann::json;
using testing_util::ChildProcess;

using testing_util::ChildrenOf;
using testing_util::Cmdline;
using testing_util::FlagValue;
using testing_util::ProcessAlive;
using testing_util::ReadLog;
using testing_util::ShmSegmentsOf;
using testing_util::WaitReady;

TEST(LauncherE2eTest, ServesTheBundledModelAndStopsCleanly) {
  testing_util::TempDir dir("launcher");
  const int port = testing_util::FreeLoopbackPortBlock();
  const std::string log = dir / "up.log";
  ChildProcess up({std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port),
                   "--log-dir", dir / "logs", "--max-model-len", "512"},
                  log);
  const int pid = up.pid();
  ASSERT_TRUE(WaitReady(port, up)) << ReadLog(log);
  // The launcher prints its banner right after it sees /ready itself.
  std::string banner;
  for (int i = 0; i < 200 && banner.find("curl ") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    banner = ReadLog(log);
  }
  EXPECT_NE(banner.find("curl http://127.0.0.1:" + std::to_string(port) + "/v1/chat/completions"),
            std::string::npos)
      << banner;
  const std::vector<int> children = ChildrenOf(pid);
  EXPECT_GE(children.size(), 3u);  // coordinator, GPU worker, expert worker(s)
  EXPECT_FALSE(ShmSegmentsOf(pid).empty());
  // With the cpu backend the GPU worker computes on the expert workers' cores, so they are started
  // with a short idle spin; with the cuda backend, whose expert workers have cores of their own, a
  // long one.
  std::string backend;
  int expert_workers = 0;
  for (int child : children) {
    const std::vector<std::string> args = Cmdline(child);
    if (args.empty()) continue;
    if (args[0].ends_with("splitserve-gpu-worker")) backend = FlagValue(args, "--backend");
  }
  for (int child : children) {
    const std::vector<std::string> args = Cmdline(child);
    if (args.empty() || !args[0].ends_with("splitserve-expert-worker")) continue;
    ++expert_workers;
    EXPECT_EQ(FlagValue(args, "--spin_us"), backend == "cpu" ? "20" : "5000")
        << "backend " << backend;
  }
  EXPECT_GE(expert_workers, 1);
  EXPECT_FALSE(backend.empty());

  // The README's request.
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/chat/completions",
                  R"({"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}],)"
                  R"( "max_tokens": 16})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models && models->status == 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
  // --max-model-len reached the gateway: reported, and a longer request is refused.
  EXPECT_EQ(json::parse(models->body)["data"][0]["max_model_len"], 512) << models->body;
  auto too_long = c.Post("/v1/chat/completions",
                         R"({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],)"
                         R"( "max_tokens": 600})",
                         "application/json");
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  EXPECT_NE(too_long->body.find("context_length_exceeded"), std::string::npos) << too_long->body;

  EXPECT_EQ(up.Stop(), 0) << ReadLog(log);
  for (int child : children) EXPECT_FALSE(ProcessAlive(child)) << child;
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
}

TEST(LauncherE2eTest, ChildrenDieWithAKilledLauncher) {
  testing_util::TempDir dir("launcher_kill");
  const int port = testing_util::FreeLoopbackPortBlock();
  ChildProcess up({std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port)},
                  dir / "up.log");
  const int pid = up.pid();
  ASSERT_TRUE(WaitReady(port, up)) << ReadLog(dir / "up.log");
  const std::vector<int> children = ChildrenOf(pid);
  ASSERT_GE(children.size(), 3u);
  up.Kill();
  up.Wait();
  for (int child : children) {
    bool gone = false;
    for (int i = 0; i < 300 && !gone; ++i) {
      gone = !ProcessAlive(child);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(gone) << "child " << child << " outlived the launcher";
  }
  // Expert workers unlink their segments on the SIGTERM their parent's death sends.
  for (int i = 0; i < 100 && !ShmSegmentsOf(pid).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(ShmSegmentsOf(pid).empty());
}

TEST(LauncherE2eTest, BadArgumentsAreUsageErrors) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--port", "99999"},
           {"--backend", "tpu"},
           {"--bogus", "1"},
           {"--model", "/nonexistent"},
           {"--stages", "99"},
           {"--tp", "0"},
           {"--backend", "cpu", "--tp", "2"},
           {"--kv-tokens", "0"},
           {"--max-model-len", "999999"},
           {"--stage-transport", "rdma"},
           {"--fp64-sums", "double"},
           {"--gpu-prefill-threshold", "0"},
           {"--gpu-prefill-ring-mib", "-1"},
           {"--backend", "cpu", "--gpu-prefill-ring-mib", "2048"},  // the cuda backend's path
           {"--backend", "cpu", "--gpu-prefill-threshold", "512"},
           {"--gpu-experts", "1.5"},
           {"--gpu-experts-rebalance-s", "-1"},
           {"--gpu-experts-rebalance-s", "5"},  // without --gpu-experts: nothing to rebalance
           {"--gpu-experts-rebalance-s", "soon"},
           {"--max-num-batched-tokens", "8"},  // fewer than max_running's 64 decode tokens
           {"--backend", "cpu", "--stages", "2", "--stage-transport", "nccl"}}) {
    std::vector<std::string> argv = {std::string(SS_BIN_DIR) + "/splitserve", "up"};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess p(argv, "/dev/null");
    const int code = p.Wait();
    EXPECT_TRUE(code == 1 || code == 2) << args[0] << " exit " << code;
  }
}

// `up --log-level / --log-format` reach every child (issue 29): each is started with them, and
// with json every line of every child's log (--log-dir) is one JSON object naming that child.
TEST(LauncherE2eTest, LogFlagsReachEveryChild) {
  testing_util::TempDir dir("launcher_logs");
  const int port = testing_util::FreeLoopbackPortBlock();
  const std::string log = dir / "up.log";
  ChildProcess up(
      {std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port), "--log-dir",
       dir / "logs", "--max-model-len", "512", "--log-level", "info", "--log-format", "json"},
      log);
  ASSERT_TRUE(WaitReady(port, up)) << ReadLog(log);
  int children = 0;
  for (int child : ChildrenOf(up.pid())) {
    const std::vector<std::string> args = Cmdline(child);
    if (args.empty()) continue;
    ++children;
    // The children rewrite "--log-level" to "--log_level" in place (NormalizeFlagDashes).
    EXPECT_EQ(FlagValue(args, "--log_level"), "info") << args[0];
    EXPECT_EQ(FlagValue(args, "--log_format"), "json") << args[0];
  }
  EXPECT_GE(children, 3);
  EXPECT_EQ(up.Stop(), 0) << ReadLog(log);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "logs")) {
    ++files;
    std::ifstream in(e.path());
    int lines = 0;
    for (std::string line; std::getline(in, line);) {
      ++lines;
      const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(j.is_object()) << e.path() << ": " << line;
      EXPECT_TRUE(j["logger"].get<std::string>().starts_with("splitserve-")) << line;
      EXPECT_TRUE(j.contains("time") && j.contains("level") && j.contains("pid") &&
                  j.contains("message"))
          << line;
    }
    EXPECT_GT(lines, 0) << e.path();
  }
  EXPECT_GE(files, 3);
}

// `up --help` lists the streamed-prefill and step-size flags with their defaults.
TEST(LauncherE2eTest, HelpListsTheStepAndStreamedPrefillFlags) {
  testing_util::TempDir dir("launcher_help");
  const std::string log = dir / "help.log";
  ChildProcess p({std::string(SS_BIN_DIR) + "/splitserve", "up", "--help"}, log);
  EXPECT_EQ(p.Wait(), 0);
  const std::string help = ReadLog(log);
  for (const char* want :
       {"--max-num-batched-tokens N", "--gpu-prefill-threshold auto|off|N",
        "--gpu-prefill-ring-mib auto|MIB", "routed experts to the GPU: 8192 at any --max-model-len",
        "auto (default): 3072, 2048 or 1024"}) {
    EXPECT_NE(help.find(want), std::string::npos) << want << "\n" << help;
  }
}

// API keys come from a file (or the environment), never argv (issue 23 row 9): `up --api-keys`
// and key lists that would turn authentication off are refused at start; with --api-keys-file the
// coordinator gets the file's path, so no key shows in any process's command line.
TEST(LauncherE2eTest, ApiKeysComeFromAFileNeverArgv) {
  testing_util::TempDir dir("launcher_keys");
  const std::string bad = dir / "bad_keys";
  std::ofstream(bad) << " , \n";
  const std::string keys = dir / "keys";
  std::ofstream(keys) << "sk-e2e-first\n sk-e2e-second \n";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--api-keys", "sk-e2e-first"},
                                             {"--api-keys", ","},
                                             {"--api-keys-file", bad},
                                             {"--api-keys-file", dir / "missing"}}) {
    std::vector<std::string> argv = {std::string(SS_BIN_DIR) + "/splitserve", "up"};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = dir / "refused.log";
    ChildProcess p(argv, log);
    EXPECT_EQ(p.Wait(), 2) << args[0] << " " << args[1] << ": " << ReadLog(log);
    EXPECT_NE(ReadLog(log).find(args[0]), std::string::npos) << ReadLog(log);
  }

  const int port = testing_util::FreeLoopbackPortBlock();
  const std::string log = dir / "up.log";
  ChildProcess up({std::string(SS_BIN_DIR) + "/splitserve", "up", "--port", std::to_string(port),
                   "--max-model-len", "512", "--api-keys-file", keys},
                  log);
  ASSERT_TRUE(WaitReady(port, up)) << ReadLog(log);
  bool saw_coordinator = false;
  for (int child : ChildrenOf(up.pid())) {
    const std::vector<std::string> args = Cmdline(child);
    for (const std::string& a : args) EXPECT_EQ(a.find("sk-e2e"), std::string::npos) << a;
    if (!args.empty() && args[0].ends_with("splitserve-coordinator")) {
      saw_coordinator = true;
      // (the coordinator rewrites its flags' dashes in place: /proc shows --api_keys_file)
      EXPECT_EQ(FlagValue(args, "--api_keys_file"), std::filesystem::absolute(keys).string());
    }
  }
  EXPECT_TRUE(saw_coordinator);
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << r->body;
  r = c.Get("/v1/models", {{"Authorization", "Bearer sk-e2e-second"}});  // trimmed in the file
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(up.Stop(), 0) << ReadLog(log);
}

// `splitserve cpus`: bad flags are usage errors; the plan for this host either keeps whole cores
// for the GPU workers and the coordinator, each CPU given once, or says why it does not split.
TEST(LauncherE2eTest, CpusPrintsThisHostsSplitOrWhyNot) {
  testing_util::TempDir dir("ss_cpus");
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{},
                                             {"--gpu-workers", "0"},
                                             {"--gpu-workers", "1", "--coordinator", "maybe"},
                                             {"--gpu-workers", "1", "--bogus", "1"},
                                             {"--gpu-workers", "1", "--write-dropins", ""},
                                             {"--gpu-workers"}}) {
    std::vector<std::string> argv = {std::string(SS_BIN_DIR) + "/splitserve", "cpus"};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess p(argv, dir / "bad.log");
    EXPECT_EQ(p.Wait(), 2) << (args.empty() ? "no flags" : args[0]);
  }
  ChildProcess p({std::string(SS_BIN_DIR) + "/splitserve", "cpus", "--gpu-workers", "1",
                  "--write-dropins", dir / "units"},
                 dir / "plan.log");
  ASSERT_EQ(p.Wait(), 0);
  std::ifstream in(dir / "plan.log");
  const std::string out((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(out.find("this host: node"), std::string::npos) << out;
  const std::string gpu_unit =
      dir / "units/splitserve-gpu-worker@.service.d/50-splitserve-cpus.conf";
  const size_t serving = out.find("GPU workers and the coordinator: cpus ");
  if (serving == std::string::npos) {
    EXPECT_NE(out.find("no split: even 2 core(s)"), std::string::npos) << out;
    EXPECT_NE(out.find("(no drop-ins written)"), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(dir / "units")) << out;
    return;
  }
  EXPECT_NE(out.find("expert worker"), std::string::npos) << out;
  // The drop-in carries the printed serving CPUs.
  const size_t end = out.find('\n', serving);
  const std::string cpus = out.substr(serving + 38, end - serving - 38);
  EXPECT_NE(testing_util::ReadAll(gpu_unit).find("CPUAffinity=" + cpus + "\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("wrote " + gpu_unit), std::string::npos) << out;
}

}  // namespace
}  // namespace ss
