// The flag table of splitserve-gpu-worker: every flag's name, default and help line, defined once
// in worker_flags.cc (linked into the executable only, so no library defines a flag). The
// defaults are WorkerFlags' (worker_config.h) and PlanFlags' (plan_command.h); the values are
// validated by ParseWorkerConfig and PrintPlan. Call the readers after absl::ParseCommandLine.
#pragma once

#include "gpu_worker/plan_command.h"
#include "gpu_worker/worker_config.h"

namespace ss::gpu {

// The serving flags, as given.
WorkerFlags ReadWorkerFlags();

// --plan: print the memory plan and exit instead of serving.
bool PlanRequested();

// The --plan_* flags and --model.
PlanFlags ReadPlanFlags();

}  // namespace ss::gpu
