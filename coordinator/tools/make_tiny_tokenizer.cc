// make_tiny_tokenizer: writes the bundled tiny model's tokenizer.json (tiny_tokenizer.h).
//
//   make_tiny_tokenizer --corpus models/tiny/corpus.txt --out models/tiny/tokenizer.json
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "coordinator/tools/tiny_tokenizer.h"

ABSL_FLAG(std::string, corpus, "models/tiny/corpus.txt", "UTF-8 text the merges are learned from");
ABSL_FLAG(std::string, out, "models/tiny/tokenizer.json", "where to write tokenizer.json");
ABSL_FLAG(int32_t, vocab_size, 1024, "every id is below this (the model's vocab_size)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("make_tiny_tokenizer [--corpus FILE] [--out FILE] [--vocab_size N]");
  absl::ParseCommandLine(argc, argv);
  const std::string corpus_path = absl::GetFlag(FLAGS_corpus), out = absl::GetFlag(FLAGS_out);
  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "make_tiny_tokenizer: cannot read %s\n", corpus_path.c_str());
    return 1;
  }
  std::stringstream corpus;
  corpus << in.rdbuf();
  auto json = ss::tools::MakeTinyTokenizerJson(corpus.str(), absl::GetFlag(FLAGS_vocab_size));
  if (!json.ok()) {
    std::fprintf(stderr, "make_tiny_tokenizer: %s\n", std::string(json.status().message()).c_str());
    return 1;
  }
  std::ofstream o(out, std::ios::binary | std::ios::trunc);
  o << *json;
  if (!o.flush()) {
    std::fprintf(stderr, "make_tiny_tokenizer: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("make_tiny_tokenizer: wrote %s (%zu bytes)\n", out.c_str(), json->size());
  return 0;
}
