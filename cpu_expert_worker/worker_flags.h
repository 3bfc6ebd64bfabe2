// The flag table of splitserve-expert-worker: every flag's name, default (WorkerFlags',
// worker_config.h) and help line, defined once in worker_flags.cc (linked into the executable
// only, so no library defines a flag); ParseWorkerConfig validates the values.
#pragma once

#include "cpu_expert_worker/worker_config.h"

namespace ss::expert {

// The flags as given; call after absl::ParseCommandLine.
WorkerFlags ReadWorkerFlags();

}  // namespace ss::expert
