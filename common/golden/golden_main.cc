// splitserve-golden: runs every check of a golden set against the reference model and prints one
// line per check with its figures, then "golden: <N> checks, <F> failed". Exit status 0 only
// when every check passes.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "common/golden/golden.h"

ABSL_FLAG(std::string, model, "", "checkpoint directory (config.json + model*.safetensors)");
ABSL_FLAG(std::string, golden, "", "golden set directory (cases.json, golden*.safetensors)");
ABSL_FLAG(std::string, filter, "", "comma-separated substrings: run only matching checks");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("splitserve-golden --model DIR --golden DIR [--filter a,b]");
  absl::ParseCommandLine(argc, argv);
  ss::golden::GoldenOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.golden_dir = absl::GetFlag(FLAGS_golden);
  if (o.model_dir.empty() || o.golden_dir.empty()) {
    std::fprintf(stderr, "splitserve-golden: --model and --golden are required\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_filter).empty()) {
    o.filters = absl::StrSplit(absl::GetFlag(FLAGS_filter), ',', absl::SkipEmpty());
  }
  auto results = ss::golden::RunGolden(o);
  if (!results.ok()) {
    std::fprintf(stderr, "splitserve-golden: %s\n",
                 std::string(results.status().message()).c_str());
    return 1;
  }
  int failed = 0;
  for (const auto& r : *results) {
    failed += !r.pass;
    std::printf("%s %-34s %s\n", r.pass ? "PASS" : "FAIL", r.name.c_str(), r.figures.c_str());
    std::fflush(stdout);
  }
  std::printf("golden: %zu checks, %d failed\n", results->size(), failed);
  return failed == 0 && !results->empty() ? 0 : 1;
}
