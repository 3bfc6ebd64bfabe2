// fake_gateway: the OpenAI gateway over a FakeEngine, for client tests that run outside this
// process (tests/e2e/openai_client). Prints "port N" on stdout once listening; stops on SIGTERM or
// SIGINT.
//
// The engine's reply depends on the prompt, so that a tool-call round trip works:
//   a prompt with a tool result (`<tool_result>`)  -> kAnswerText
//   a prompt whose tools include get_weather      -> kToolCallText (a DSML get_weather call)
//   anything else                                 -> kHelloText
// Each id comes 1 ms apart (--step_ms), so streams arrive in several chunks.
//
//   fake_gateway [--tokenizer FILE] [--host H] [--port P] [--model_name NAME] [--step_ms MS]
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "coordinator/openai_server.h"
#include "coordinator/tokenizer.h"
#include "tests/coordinator/fake_engine.h"

ABSL_FLAG(std::string, tokenizer, SS_MODELS_DIR "/tiny/tokenizer.json", "tokenizer.json");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 0, "port (0: any free one)");
ABSL_FLAG(std::string, model_name, "deepseek-v4", "model id served");
ABSL_FLAG(int, step_ms, 1, "milliseconds between generated ids");

namespace {

constexpr char kHelloText[] = "Hello! I am splitserve's fake engine. 2 + 2 = 4.";
constexpr char kAnswerText[] = "It is sunny in Paris, 22 degrees.";
constexpr char kToolCallText[] =
    "Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "fake_gateway [--tokenizer FILE] [--host H] [--port P] [--model_name NAME] [--step_ms MS]");
  absl::ParseCommandLine(argc, argv);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto tok = ss::Tokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) {
    std::fprintf(stderr, "fake_gateway: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  const ss::Tokenizer& tokenizer = **tok;
  auto ids = [&](const char* text) {
    auto v = tokenizer.Encode(text);
    return v.ok() ? *v : std::vector<int32_t>{};
  };
  const std::vector<int32_t> hello = ids(kHelloText), answer = ids(kAnswerText),
                             tool_call = ids(kToolCallText);
  ss::FakeEngine engine(
      ss::FakeEngine::Options{{}, false, std::chrono::milliseconds(absl::GetFlag(FLAGS_step_ms))});
  engine.set_script_fn([&](const ss::GenerationRequest& req) {
    auto prompt = tokenizer.Decode(req.prompt);
    if (!prompt.ok()) return hello;
    // Only the last user turn counts: an earlier tool round trip must not answer again.
    const size_t last_user = prompt->rfind("<｜User｜>");
    const std::string turn = last_user == std::string::npos ? *prompt : prompt->substr(last_user);
    if (turn.find("<tool_result>") != std::string::npos) return answer;
    if (prompt->find("get_weather") != std::string::npos) return tool_call;
    return hello;
  });

  ss::GatewayConfig config;
  config.model_name = absl::GetFlag(FLAGS_model_name);
  config.max_context_tokens = 65536;
  ss::OpenAiServer server(config, tokenizer, engine);
  auto port = server.Start(absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port));
  if (!port.ok()) {
    std::fprintf(stderr, "fake_gateway: %s\n", std::string(port.status().message()).c_str());
    return 1;
  }
  std::printf("port %d\n", *port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  server.Stop();
  return 0;
}
