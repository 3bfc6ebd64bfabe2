// splitserve-generate: greedy generation with the reference model from a prompt of token ids.
// The main job until the launcher exists; it runs on the bundled tiny checkpoint by default.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/layer_list.h"
#include "common/main_flags.h"
#include "common/model/model.h"

ABSL_FLAG(std::string, model, "tests/data/tiny-a", "checkpoint directory");
ABSL_FLAG(std::string, prompt_ids, "0,863,523,337,838,575,599,1021,75",
          "comma-separated prompt token ids");
ABSL_FLAG(int, max_new_tokens, 32, "tokens to generate (greedy)");
ABSL_FLAG(bool, stop_at_eos, true, "stop when the model's eos token is generated");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "splitserve-generate [--model DIR] [--prompt_ids 1,2,3] [--max_new_tokens N]");
  ss::InitFlagsUsage("splitserve-generate");
  ss::NormalizeFlagDashes(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = ss::ApplyLogFlags("splitserve-generate"); !s.ok()) {
    std::fprintf(stderr, "splitserve-generate: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  std::vector<int64_t> prompt;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',', absl::SkipWhitespace())) {
    int64_t id;
    if (!absl::SimpleAtoi(s, &id)) {
      std::fprintf(stderr, "splitserve-generate: --prompt_ids: '%s' is not an integer\n",
                   std::string(s).c_str());
      return 2;
    }
    prompt.push_back(id);
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "splitserve-generate: --prompt_ids is empty\n");
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto model = ss::model::Model::Load(absl::GetFlag(FLAGS_model));
  if (!model.ok()) {
    std::fprintf(stderr, "splitserve-generate: %s\n",
                 std::string(model.status().message()).c_str());
    return 1;
  }
  const auto& m = **model;
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("model %s: %ld layers, dim %ld, vocab %ld, loaded in %.2f s\n",
              absl::GetFlag(FLAGS_model).c_str(), static_cast<long>(m.config().n_layers),
              static_cast<long>(m.config().dim), static_cast<long>(m.config().vocab_size),
              std::chrono::duration<double>(t1 - t0).count());
  std::printf("prompt: %s\n", absl::StrJoin(prompt, " ").c_str());

  ss::model::SequenceState st = m.NewSequence();
  std::vector<int64_t> feed = prompt, generated;
  double prefill_s = 0, decode_s = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_max_new_tokens); ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    ss::model::ChunkRef ch{&st, feed.data(), static_cast<int64_t>(feed.size()), 0};
    auto logits = m.Forward({&ch, 1});
    if (!logits.ok()) {
      std::fprintf(stderr, "splitserve-generate: %s\n",
                   std::string(logits.status().message()).c_str());
      return 1;
    }
    const std::vector<float>& l = (*logits)[0];
    const int64_t next = std::max_element(l.begin(), l.end()) - l.begin();
    (i == 0 ? prefill_s : decode_s) +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    generated.push_back(next);
    std::printf("%ld ", static_cast<long>(next));
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_stop_at_eos) && next == m.config().eos_token_id) break;
    feed = {next};
  }
  std::printf("\ngenerated %zu tokens: prefill %zu tokens in %.3f s, decode %.1f ms/token\n",
              generated.size(), prompt.size(), prefill_s,
              generated.size() > 1 ? 1e3 * decode_s / (generated.size() - 1) : 0.0);
  return 0;
}
