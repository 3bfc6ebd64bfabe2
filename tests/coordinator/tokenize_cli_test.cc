// `splitserve tokenize` end to end: JSON lines in, JSON lines out, one per input line; bad lines
// give error lines without stopping; only a tokenizer that cannot load fails the command.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/run_command.h"
#include "tests/test_util.h"

namespace ss {
namespace {

using nlohmann::json;
using testing_util::TempDir;

struct CliRun {
  int status = -1;  // exit status, or 128 + signal
  std::string out;  // stdout only
};

// Runs `args` after the binary with `input` on stdin; stderr goes to `dir`/stderr.
CliRun Splitserve(const TempDir& dir, const std::string& args, const std::string& input) {
  std::ofstream(dir / "stdin") << input;
  const testing_util::CommandResult r =
      testing_util::RunCommand(std::string(SS_BIN_DIR "/splitserve ") + args + " < " +
                               dir / "stdin" + " 2> " + dir / "stderr");
  return CliRun{r.status, r.output};
}

std::string Stderr(const TempDir& dir) {
  std::ifstream in(dir / "stderr");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<json> Lines(const std::string& out) {
  std::vector<json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) v.push_back(json::parse(line));
  return v;
}

const std::string kTok = std::string("--tokenizer ") + SS_TOKENIZER_JSON;

TEST(TokenizeCliTest, EncodeWithErrorLines) {
  TempDir dir("ss_cli_tok");
  const CliRun r = Splitserve(dir, "tokenize " + kTok,
                              "{\"text\": \"Hello world\"}\n"
                              "not json\n"
                              "{\"txt\": 1}\n"
                              "\n"
                              "{\"text\": \"<｜User｜><think>\"}\n");
  ASSERT_EQ(r.status, 0) << Stderr(dir);
  const std::vector<json> out = Lines(r.out);
  ASSERT_EQ(out.size(), 5u) << r.out;
  EXPECT_EQ(out[0], (json{{"ids", {19923, 2058}}}));
  for (int i : {1, 2, 3}) {
    ASSERT_TRUE(out[i].contains("error")) << out[i];
    EXPECT_EQ(out[i]["error"].get<std::string>().rfind("line " + std::to_string(i + 1) + ":", 0),
              0u)
        << out[i];
  }
  EXPECT_EQ(out[4], (json{{"ids", {128803, 30, 37947, 32}}}));
}

TEST(TokenizeCliTest, AddedTokensAndDecode) {
  TempDir dir("ss_cli_tok");
  const std::string added =
      std::string(" --added-tokens=") + SS_TOKENIZER_DATA + "/v4_added_tokens.json";
  CliRun r = Splitserve(dir, "tokenize " + kTok + added, "{\"text\": \"<｜User｜><think>\"}\n");
  ASSERT_EQ(r.status, 0) << Stderr(dir);
  EXPECT_EQ(Lines(r.out), std::vector<json>{(json{{"ids", {128803, 128821}}})});

  r = Splitserve(dir, "tokenize --decode " + kTok + added,
                 "{\"ids\": [128803, 128821, 28927, 225]}\n"
                 "{\"ids\": [28927]}\n"
                 "{\"ids\": [128815]}\n"
                 "{\"ids\": [-1]}\n"
                 "{\"ids\": \"x\"}\n");
  ASSERT_EQ(r.status, 0) << Stderr(dir);
  const std::vector<json> out = Lines(r.out);
  ASSERT_EQ(out.size(), 5u) << r.out;
  EXPECT_EQ(out[0], (json{{"text", "<｜User｜><think>😀"}}));
  EXPECT_EQ(out[1], (json{{"text", "\xEF\xBF\xBD"}}));
  for (int i : {2, 3, 4}) EXPECT_TRUE(out[i].contains("error")) << out[i];
}

TEST(TokenizeCliTest, LoadFailuresAndUsage) {
  TempDir dir("ss_cli_tok");
  CliRun r = Splitserve(dir, "tokenize --tokenizer " + dir / "missing.json", "");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(Stderr(dir).find("missing.json"), std::string::npos) << Stderr(dir);

  std::ofstream(dir / "bad.json") << "{\"model\": ";
  r = Splitserve(dir, "tokenize --tokenizer " + dir / "bad.json", "");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(Stderr(dir).find("bad.json"), std::string::npos) << Stderr(dir);

  r = Splitserve(dir, "tokenize " + kTok + " --added-tokens " + dir / "nope.json", "");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(Stderr(dir).find("nope.json"), std::string::npos) << Stderr(dir);

  r = Splitserve(dir, "tokenize", "");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(Stderr(dir).find("--tokenizer"), std::string::npos) << Stderr(dir);

  r = Splitserve(dir, "tokenize " + kTok + " --bogus", "");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(Stderr(dir).find("--bogus"), std::string::npos) << Stderr(dir);

  r = Splitserve(dir, "frobnicate", "");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(Stderr(dir).find("unknown command 'frobnicate'"), std::string::npos) << Stderr(dir);
  EXPECT_NE(Stderr(dir).find("tokenize"), std::string::npos) << Stderr(dir);

  r = Splitserve(dir, "", "");
  EXPECT_EQ(r.status, 2);
}

}  // namespace
}  // namespace ss
