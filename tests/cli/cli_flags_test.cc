// The command-line surface every splitserve binary shares: --version's one line, --help listing
// the program's own flags, --log_level / --log_format (a bad value is a usage error, exit 2; json
// gives one JSON object a line), and `splitserve up` / `cpus` / `tokenize` / `bench serve`
// naming an unknown option instead of asking it for a value.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/run_command.h"

namespace ss {
namespace {

using CmdResult = testing_util::CommandResult;

CmdResult RunBinary(const std::string& binary, const std::string& args,
                    const std::string& streams = "2>&1") {
  return testing_util::RunCommand(std::string(SS_BIN_DIR "/") + binary + " " + args + " " +
                                  streams);
}

// The binaries of this build (tests/cli/CMakeLists.txt).
std::vector<std::string> Binaries() { return absl::StrSplit(SS_CLI_BINARIES, ','); }

bool Built(const std::string& binary) {
  const std::vector<std::string> b = Binaries();
  return std::find(b.begin(), b.end(), binary) != b.end();
}

// The absl-flags mains and one flag of each one's own.
std::vector<std::pair<std::string, std::string>> AbslMains() {
  const std::pair<std::string, std::string> all[] = {{"splitserve-coordinator", "control_listen"},
                                                     {"splitserve-gpu-worker", "worker_id"},
                                                     {"splitserve-expert-worker", "shm_name"},
                                                     {"splitserve-generate", "prompt_ids"},
                                                     {"splitserve-golden", "golden"}};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& m : all) {
    if (Built(m.first)) out.push_back(m);
  }
  return out;
}

TEST(CliFlagsTest, VersionIsOneLine) {
  ASSERT_GE(Binaries().size(), 2u);
  for (const std::string& b : Binaries()) {
    const CmdResult r = RunBinary(b, "--version", "2>/dev/null");
    EXPECT_EQ(r.status, 0) << b << ": " << r.output;
    const std::regex line(b + " " + SS_PROJECT_VERSION +
                          R"( \(commit ([0-9a-f]{4,40}(\+dirty)?|unknown), [A-Za-z][^()\n]*\)\n)");
    EXPECT_TRUE(std::regex_match(r.output, line)) << b << ": '" << r.output << "'";
  }
  // The multi-command binary also answers it for `up`.
  if (!Built("splitserve")) return;
  const CmdResult up = RunBinary("splitserve", "up --version", "2>/dev/null");
  EXPECT_EQ(up.status, 0);
  EXPECT_EQ(up.output, RunBinary("splitserve", "--version", "2>/dev/null").output);
}

TEST(CliFlagsTest, HelpListsTheProgramsOwnFlags) {
  const auto mains = AbslMains();
  ASSERT_FALSE(mains.empty());
  for (const auto& [b, own] : mains) {
    const CmdResult r = RunBinary(b, "--help");
    EXPECT_EQ(r.output.find("No flags matched"), std::string::npos) << b << ":\n" << r.output;
    EXPECT_NE(r.output.find("--" + own + " ("), std::string::npos) << b << ":\n" << r.output;
    EXPECT_NE(r.output.find("--log_level ("), std::string::npos) << b;
    EXPECT_NE(r.output.find("--log_format ("), std::string::npos) << b;
    // absl's own flags only with --helpfull; file names relative to the source tree.
    EXPECT_EQ(r.output.find("--flagfile ("), std::string::npos) << b;
    EXPECT_NE(r.output.find("Flags from common/main_flags.cc:"), std::string::npos) << b;
    EXPECT_NE(RunBinary(b, "--helpfull").output.find("--flagfile ("), std::string::npos) << b;
  }
}

TEST(CliFlagsTest, BadLogFlagsAreUsageErrors) {
  for (const auto& [b, own] : AbslMains()) {
    for (const char* args : {"--log_level=bogus", "--log-level=bogus", "--log_level bogus"}) {
      const CmdResult r = RunBinary(b, args);
      EXPECT_EQ(r.status, 2) << b << " " << args << ": " << r.output;
      EXPECT_NE(r.output.find("--log_level 'bogus'"), std::string::npos) << b << ": " << r.output;
    }
    const CmdResult r = RunBinary(b, "--log_format=xml");
    EXPECT_EQ(r.status, 2) << b << ": " << r.output;
    EXPECT_NE(r.output.find("--log_format 'xml'"), std::string::npos) << b << ": " << r.output;
  }
  if (!Built("splitserve")) return;
  CmdResult r = RunBinary("splitserve", "up --log-level bogus");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("splitserve up: --log-level 'bogus'"), std::string::npos) << r.output;
  r = RunBinary("splitserve", "up --log-format=xml");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("splitserve up: --log-format 'xml'"), std::string::npos) << r.output;
}

// The coordinator warns through spdlog about --insecure_cluster before it fails on the missing
// model: in json every stdout line is one JSON object.
TEST(CliFlagsTest, JsonLogLines) {
  const auto mains = AbslMains();
  if (mains.empty() || mains.front().first != "splitserve-coordinator") {
    GTEST_SKIP() << "splitserve-coordinator is not built here";
  }
  const std::string args = "--insecure_cluster --model /nonexistent --cluster /nonexistent";
  for (const char* format : {"--log_format=json", "--log-format json"}) {
    const CmdResult r =
        RunBinary("splitserve-coordinator", std::string(format) + " " + args, "2>/dev/null");
    EXPECT_EQ(r.status, 1) << r.output;
    int warnings = 0;
    for (absl::string_view line : absl::StrSplit(r.output, '\n', absl::SkipEmpty())) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
      EXPECT_EQ(j["logger"], "splitserve-coordinator");
      if (j["level"] == "warning" &&
          j["message"].get<std::string>().find("--insecure_cluster") != std::string::npos) {
        ++warnings;
      }
    }
    EXPECT_EQ(warnings, 1) << r.output;
  }
  const CmdResult text = RunBinary("splitserve-coordinator", args, "2>/dev/null");
  EXPECT_NE(text.output.find("[warning] splitserve-coordinator: --insecure_cluster"),
            std::string::npos)
      << text.output;
  const CmdResult quiet =
      RunBinary("splitserve-coordinator", "--log_level=error " + args, "2>/dev/null");
  EXPECT_EQ(quiet.output, "");
}

TEST(CliFlagsTest, UnknownOptionsAreNamed) {
  if (!Built("splitserve")) GTEST_SKIP() << "splitserve is not built here";
  for (const char* args : {"up --bogus", "up --bogus 1", "up --bogus=1"}) {
    const CmdResult r = RunBinary("splitserve", args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.output, "splitserve up: unknown option '--bogus' (see --help)\n") << args;
  }
  CmdResult r = RunBinary("splitserve", "up --port");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("splitserve up: --port needs a value"), std::string::npos) << r.output;
  // '_' reads as '-' in a name, never in its value.
  r = RunBinary("splitserve", "up --model=/no_such_dir_here");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("/no_such_dir_here/config.json"), std::string::npos) << r.output;
  r = RunBinary("splitserve", "up --enable_prefix_caching=1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--enable-prefix-caching takes no value"), std::string::npos) << r.output;
  r = RunBinary("splitserve", "cpus --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.output, "splitserve cpus: unknown option '--bogus' (see --help)\n");
  r = RunBinary("splitserve", "cpus --gpu-workers");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--gpu-workers needs a value"), std::string::npos) << r.output;
  r = RunBinary("splitserve", "tokenize --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown argument '--bogus'"), std::string::npos) << r.output;
  r = RunBinary("splitserve", "bench serve --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown flag '--bogus'"), std::string::npos) << r.output;
}

// Every option `up --help` shows is one `up` knows: given last without a value, it asks for one.
TEST(CliFlagsTest, UpKnowsEveryOptionItsHelpShows) {
  if (!Built("splitserve")) GTEST_SKIP() << "splitserve is not built here";
  const CmdResult help = RunBinary("splitserve", "up --help", "2>/dev/null");
  ASSERT_EQ(help.status, 0);
  const std::set<std::string> switches = {"--help", "--version", "--enable-prefix-caching",
                                          "--no-enable-prefix-caching"};
  const std::regex option("--[a-z][a-z0-9-]*[a-z0-9]");
  std::set<std::string> options;
  for (auto it = std::sregex_iterator(help.output.begin(), help.output.end(), option);
       it != std::sregex_iterator(); ++it) {
    if (!switches.contains(it->str())) options.insert(it->str());
  }
  EXPECT_GE(options.size(), 20u);
  EXPECT_TRUE(options.contains("--log-level"));
  EXPECT_TRUE(options.contains("--log-format"));
  for (const std::string& o : options) {
    const CmdResult r = RunBinary("splitserve", "up " + o);
    EXPECT_EQ(r.status, 2) << o;
    EXPECT_NE(r.output.find(o + " needs a value"), std::string::npos) << o << ": " << r.output;
  }
}

}  // namespace
}  // namespace ss
