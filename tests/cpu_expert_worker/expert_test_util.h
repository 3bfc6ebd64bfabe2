// Shared by the store, engine and worker tests: a generated checkpoint whose experts can be cut
// in two (moe_intermediate_size 256; tiny-a's 128 cannot), and small helpers.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/tools/checkpoint_generator.h"
#include "tests/tools/test_configs.h"

namespace ss::expert::testing_util {

inline constexpr char kTinyA[] = "tests/data/tiny-a";

// The generated checkpoint's config (tests/tools/test_configs.h): I = 256.
inline constexpr const char* kI256Config = ::ss::testing_util::kWideI256Config;

// The I = 256 checkpoint, generated once per test binary (2 shards) and removed at exit.
inline const std::string& I256Checkpoint() {
  struct Dir {
    std::string path;
    Dir() {
      path = (std::filesystem::path(::testing::TempDir()) /
              ("ss_expert_i256_" + std::to_string(::getpid())))
                 .string();
      auto cfg = ParseModelConfig(kI256Config, "I256 config");
      EXPECT_TRUE(cfg.ok()) << cfg.status();
      const absl::Status st = GenerateCheckpoint(*cfg, kI256Config, path, /*seed=*/5, /*shards=*/2);
      EXPECT_TRUE(st.ok()) << st;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

#ifdef SS_BIN_DIR
// A splitserve-expert-worker child process started with `args` (the flags after the binary),
// dying with the test (testing_util::ChildProcess).
class WorkerProcess : public ::ss::testing_util::ChildProcess {
 public:
  // `log_path`: where its stdout and stderr go ("": the test's own).
  explicit WorkerProcess(std::vector<std::string> args, const std::string& log_path = "")
      : ChildProcess(WithBinary(std::move(args)), log_path) {}

 private:
  static std::vector<std::string> WithBinary(std::vector<std::string> args) {
    args.insert(args.begin(), SS_BIN_DIR "/splitserve-expert-worker");
    return args;
  }
};
#endif  // SS_BIN_DIR

inline std::vector<int> AllLayers(const ModelConfig& c) {
  std::vector<int> l;
  for (int i = 0; i < c.n_layers + c.n_mtp_layers; ++i) l.push_back(i);
  return l;
}

}  // namespace ss::expert::testing_util
