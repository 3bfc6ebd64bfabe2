// `splitserve up`: the whole system on one machine from one command (ARCHITECTURE.md
// "Processes").
//
//   splitserve up [--model DIR] [--host H] [--port P] [--stages N] [--tp N]
//                 [--expert-workers N|auto] [--stage-transport auto|grpc|nccl]
//                 [--load-format auto|safetensors|dummy] [--hf-overrides JSON]
//
// --load-format and --hf-overrides (vLLM's names; common/weight_source.h) go to every worker, the
// overrides also to the coordinator: every process derives the same config. Unless the weights
// are dummy, a model directory without a checkpoint is refused before anything starts.
//
// It picks the layout (the cuda backend when GPUs are present and the cuda backend is built,
// else the cpu backend; one expert worker per NUMA node holding slice i/n of every layer's
// experts, n limited to what the model's expert width allows), writes the cluster config into a
// private run directory (run_dir.h: under $XDG_RUNTIME_DIR or a mkdtemp directory, 0700, no
// symlink followed, removed on exit; stale ones of killed runs removed at the next start), and
// starts every process as its child (supervisor.h): the coordinator, then the expert workers
// (shared memory) and the GPU workers, which register with it. --tp N (cuda backend) gives each
// stage N GPU workers ("gpu<s>-<r>"; "gpu<s>" for TP 1), stage s rank r on GPU (s·N + r) mod G
// (coord::AssignCudaDevices: stages may share GPUs, a stage's ranks may not; N > G is refused).
// --stage-transport nccl writes stage_transport "nccl" into the cluster config (streams between
// stages over NCCL links, proto/cluster.proto 3b); it needs a GPU per GPU worker. The default,
// auto, takes it wherever it can run (coord::LaunchStageTransport), else gRPC.
// Expert slice i goes to TP rank i mod N (cluster_config.h). With the cuda backend the coordinator
// and the GPU workers run on whole cores of their own and the expert workers on the rest
// (coord::PlanLaunchCpusFor; printed at start), since a pinned expert thread sharing its core
// with a GPU worker's spinning wait stalls every expert call. Children run in their own
// process group (so a terminal's Ctrl-C reaches only the launcher, which stops them in order) and
// with PR_SET_PDEATHSIG, so they die with the launcher even when it is killed. It waits for
// GET /ready, prints the URL and a curl example, and then supervises.
//
// Supervision. The workers (every expert worker and every GPU worker) are one restart group; the
// coordinator stays up while they restart, so clients keep their connections: requests in flight
// end with an error, new ones get 503 with Retry-After (the coordinator's /ready is 503) until the
// cluster is whole again. Restarting every worker, not just the one that failed, is the simple
// design that is always right: a GPU worker's shared-memory connections to the expert workers,
// and a TP group's NCCL communicator, are formed only at start, so a new expert worker or TP rank
// needs new GPU workers anyway; with small models the group is back in a second or two. The
// restarted GPU workers register under their old ids (the coordinator accepts them once the old
// processes no longer answer, control_service.h) and the ClusterEngine reconnects to them
// (cluster_engine.h). The group is restarted when
//   - a worker exits, whatever its status (kill -9, a crash, or a GPU worker the coordinator
//     declared dead after missed heartbeats, which then exits);
//   - a worker is stopped (SIGSTOP: state T in /proc) for kStoppedGrace;
//   - the coordinator's GET /ready has answered 503 for kNotReadyGrace while serving (a worker
//     hung otherwise: the coordinator turns /ready 503 once a micro-batch's GPU workers have made
//     no progress for its --stall_timeout_s, e.g. one waiting on a hung expert worker, whose
//     calls have a longer deadline; a long micro-batch whose workers keep working is not a stall,
//     cluster_engine.h "Stalls").
// The coordinator is restarted, with the workers, when it exits, is stopped, or does not answer
// /ready for kNotReadyGrace; it gets its previous HTTP port back. Restarts follow RestartPolicy
// (supervisor.h): 0.5 s, doubling to 8 s while restarts do not bring the cluster back; after 5 such
// restarts in a row `up` gives up (exit 1, naming the last failure). Before the cluster was ready
// the first time, a worker that dies or stops is restarted the same way (a start can fail for a
// passing reason, such as a metrics port taken for a moment), while the coordinator failing, or
// nothing getting ready within --ready-timeout-s, is reported at once (exit 1). Each recovery
// prints "serving again N s after the failure".
//
// Stop: on SIGINT / SIGTERM the coordinator drains first (running requests finish), then the
// GPU workers and the expert workers get SIGTERM; anything still alive after its grace period
// gets SIGKILL, the shared-memory names it assigned are unlinked and the run directory removed.
//
// Without --model it serves the bundled tiny model (tiny-a's random weights with the project's
// generated tokenizer: its text is noise) found in <binary dir>/../share/splitserve/tiny.
//
// Flags: an unknown option is a usage error naming it (exit 2), whether or not a value follows;
// --log-level / --log-format (common/logging.h) are validated here and passed on to every child;
// --version prints the version line (common/build_info.h).
//
// Its parts: the flags (up_options.h), each child's command line (up_plan.h) and the supervision
// loop (up_supervision.h); launcher.cc checks the inputs, resolves the layout and writes the
// cluster config.
#pragma once

namespace ss {

int RunUpCommand(int argc, char** argv);

}  // namespace ss
