// splitserve: the user-facing launcher, one binary with subcommands.
//
//   splitserve up ...         the whole system on this machine (coordinator/launcher.h)
//   splitserve tokenize ...   the tokenizer as a JSON-lines filter (coordinator/tokenize_command.h)
//   splitserve cpus ...       this host's CPUs for GPU and expert workers (coordinator/launcher.h)
//   splitserve bench serve    load an OpenAI-compatible server, as `vllm bench serve`
//                             (coordinator/bench/bench_command.h)
//
// Each subcommand parses its own arguments (argv from the subcommand word on), so their flags
// stay separate. `splitserve --version` (and `splitserve up --version`) prints the version line
// (common/build_info.h).
#include <cstdio>
#include <cstring>
#include <iostream>

#include "common/build_info.h"
#include "coordinator/bench/bench_command.h"
#include "coordinator/cpus_command.h"
#include "coordinator/launcher.h"
#include "coordinator/tokenize_command.h"

namespace {

struct Subcommand {
  const char* name;
  const char* help;
  int (*run)(int argc, char** argv);
};

int RunTokenize(int argc, char** argv) {
  return ss::RunTokenizeCommand(argc, argv, std::cin, std::cout, std::cerr);
}

int RunBench(int argc, char** argv) {
  return ss::bench::RunBenchCommand(argc, argv, std::cout, std::cerr);
}

constexpr Subcommand kSubcommands[] = {
    {"up", "start the coordinator and every worker on this machine (--help for options)",
     ss::RunUpCommand},
    {"tokenize", "JSON lines {\"text\"} -> {\"ids\"} (or back with --decode)", RunTokenize},
    {"cpus", "this host's CPUs for GPU workers and expert workers (--help for options)",
     ss::RunCpusCommand},
    {"bench", "`bench serve`: throughput and latency of an OpenAI-compatible server (vLLM's flags)",
     RunBench},
};

void Usage(FILE* f) {
  std::fprintf(f, "usage: splitserve <command> [args] | --version\ncommands:\n");
  for (const Subcommand& c : kSubcommands) std::fprintf(f, "  %-10s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("%s\n", ss::VersionLine("splitserve").c_str());
    return 0;
  }
  for (const Subcommand& c : kSubcommands) {
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "splitserve: unknown command '%s'\n", argv[1]);
  Usage(stderr);
  return 2;
}
