// What `splitserve up` shows while its children load: their progress files (common/
// load_progress.h, the workers' --load_progress_file) summed into one bar on a terminal, or a
// line every few seconds otherwise (a log, systemd's journal):
//
//   splitserve up: [########------------] loading: 12.30 of 27.10 GiB (45%), 2.10 GB/s, about
//     7 s left (gpu0 100%, expert0 40%)
//
// The total is what the children have announced so far (a GPU worker generating dummy weights
// announces its upload when the generation is done), so the percentage may step back once; a
// finished load counts what it loaded, whatever its estimate was.
// Nothing is shown before loading has run for a second (a small model shows nothing).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/load_progress.h"
#include "coordinator/console.h"

namespace ss {

// One child's loads as its file lists them (none yet: empty).
struct ChildLoad {
  std::string name;
  std::vector<LoadPhase> phases;
};

struct LoadSummary {
  int64_t done = 0, total = 0;  // over every phase listed
  bool any = false;             // some phase is listed
  bool finished = true;         // every listed phase is done
  std::string children;         // "gpu0 100%, expert0 40%": the children with phases
};

LoadSummary SummarizeLoads(const std::vector<ChildLoad>& children);

// The line (`bar_width` 0) or the terminal's bar line after `seconds` of loading, cut to
// `max_columns` (0: not cut).
std::string LoadDisplayLine(const LoadSummary& s, double seconds, int bar_width, int max_columns);

// Reads the files and draws; one per `splitserve up`, driven from its supervision loop.
class LoadDisplay {
 public:
  using Clock = std::chrono::steady_clock;
  // `files`: (child name, progress file). With `console` (a terminal) the bar is its status
  // line; without, lines go to `out`. The summary goes to `out`.
  LoadDisplay(std::vector<std::pair<std::string, std::string>> files, std::FILE* out,
              Console* console);
  // The children were (re)started now: their files are removed, loading counts from now.
  void Restart(Clock::time_point now);
  // Redraws when due (a terminal: every 250 ms; otherwise every 5 s).
  void Poll(Clock::time_point now);
  // Loading is over (`ready`: the cluster serves) or abandoned: the bar is erased; with `ready`,
  // a summary line if anything was shown.
  void Stop(Clock::time_point now, bool ready);

 private:
  LoadSummary Read() const;

  const std::vector<std::pair<std::string, std::string>> files_;
  std::FILE* const out_;
  Console* const console_;
  Clock::time_point start_, next_;
  bool shown_ = false, active_ = false;
};

}  // namespace ss
