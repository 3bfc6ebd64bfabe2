// `splitserve bench serve`: load an OpenAI-compatible server and report throughput and latency
// (bench_options.h for the flags, bench_report.h for the output).
//
// Exit status: 0 when at least one request completed (failed ones are counted in the result);
// 1 when the server cannot be reached, a file cannot be read or written, or every request failed;
// 2 for a bad command line.
#pragma once

#include <iosfwd>

namespace ss::bench {

// argv[0] is "bench"; argv[1] names the benchmark ("serve").
int RunBenchCommand(int argc, char** argv, std::ostream& out, std::ostream& err);

}  // namespace ss::bench
