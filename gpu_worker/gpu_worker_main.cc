// splitserve-gpu-worker: one pipeline stage (one TP rank) of the model's non-expert layers,
// serving the coordinator's step plans (ARCHITECTURE.md "Processes", proto/cluster.proto).
// Flags: worker_flags.h (their table), worker_config.h (their meaning and validation).
//
// Start-up: parse and validate every flag and log them; start the GpuWorker service (not ready);
// with --coordinator: Register (the role: stage, TP rank and size, layers, expert slices),
// Rendezvous (the peers: the next stage's worker of this TP rank; TP > 1: the group's NCCL
// unique id, which this worker creates and publishes when it is the stage's rank 0; under the nccl
// stage transport its stage links' ids, the one to the next stage created here), heartbeat
// every heartbeat_interval_ms; standalone: the role from the flags (TP > 1: the id through
// --nccl_id_file). Heartbeats carry the step progress (step_progress.h) and go on while steps
// run. Then load the model, join the TP group (NcclComm, blocking until every rank
// has joined) and the stage links (NcclStageLink, the outgoing one first), connect this rank's
// expert-worker slices and build the backend: Status reports
// ready (or the start-up error, the worker staying up to report it). Runs until SIGTERM / SIGINT
// (exit 0), until the coordinator says this worker is no longer a member (exit 0; 1 for a TP > 1
// rank or a linked one, whose groups are formed again only by restarting every member:
// cluster.proto 3a, 3b), until a step leaves its TP group or a stage link out of step
// (stage_runner.h; it aborts the communicator, exit 1) or
// the coordinator has been unreachable for --coordinator_timeout_ms (exit 1); then it closes its
// streams and exits. A stop that cannot finish in kStopGrace (a thread blocked in an NCCL
// collective or in joining a group whose peer died) ends the process with _exit.
//
// Exit status: 0 clean stop, 1 a runtime failure (registration refused, coordinator lost, cannot
// listen, TP group or stage link broken), 2 a usage error.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cluster_protocol.h"
#include "common/file_write.h"
#include "common/load_progress.h"
#include "common/main_flags.h"
#include "common/metrics/metrics.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "gpu_worker/coordinator_client.h"
#ifdef SS_HAVE_CUDA
#include "gpu_worker/nccl_comm.h"
#endif
#include "gpu_worker/gpu_worker_service.h"
#include "gpu_worker/stage_loader.h"
#include "gpu_worker/step_progress.h"
#include "gpu_worker/worker_config.h"
#include "gpu_worker/worker_flags.h"
#include "spdlog/spdlog.h"

namespace ss::gpu {
namespace {

constexpr char kName[] = "splitserve-gpu-worker";
// How long a stop may take before the process ends with _exit (worker_main's header).
constexpr absl::Duration kStopGrace = absl::Seconds(15);

// Why and how the process stops; the first Trigger wins. From any thread.
class StopEvent {
 public:
  void Trigger(int exit_code, const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (stopped_.load()) return;
    exit_code_ = exit_code;
    reason_ = reason;
    stopped_.store(true);
    cv_.SignalAll();
  }
  // True once triggered (waits at most `d`).
  bool WaitFor(absl::Duration d) {
    const absl::Time deadline = absl::Now() + d;
    absl::MutexLock lock(&mu_);
    while (!stopped_.load()) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    return stopped_.load();
  }
  void Wait() {
    absl::MutexLock lock(&mu_);
    while (!stopped_.load()) cv_.Wait(&mu_);
  }
  const std::atomic<bool>* flag() const { return &stopped_; }
  int exit_code() const {
    absl::MutexLock lock(&mu_);
    return exit_code_;
  }
  std::string reason() const {
    absl::MutexLock lock(&mu_);
    return reason_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // stopped_ became true
  // Written under mu_ (once, with exit_code_ and reason_); an atomic so that the blocking calls
  // given flag() can poll it without the lock.
  std::atomic<bool> stopped_{false};
  int exit_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

std::string Hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

std::string AdvertiseAddress(const WorkerConfig& c, int port) {
  if (!c.advertise.empty()) return c.advertise;
  std::string host = c.listen.substr(0, c.listen.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) host = Hostname();
  return absl::StrCat(host, ":", port);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "splitserve-gpu-worker --model DIR [--coordinator HOST:PORT --worker-id ID] "
      "[--listen HOST:PORT] [--backend cpu|cuda] [--kv-tokens N] [--metrics-listen HOST:PORT] | "
      "standalone: [--stage S --num-stages N --layers a-b --next-stage HOST:PORT] "
      "[--experts a-b=shm:NAME|grpc:HOST:PORT,...]");
  InitFlagsUsage(kName);
  NormalizeFlagDashes(argc, argv);
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "%s: unexpected argument '%s'\n", kName, rest[1]);
    return 2;
  }
  if (absl::Status s = ApplyLogFlags(kName); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, std::string(s.message()).c_str());
    return 2;
  }
  if (PlanRequested()) return PrintPlan(ReadPlanFlags());
  const WorkerFlags f = ReadWorkerFlags();
  auto parsed = ParseWorkerConfig(f);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, std::string(parsed.status().message()).c_str());
    return 2;
  }
  const WorkerConfig& c = *parsed;
  absl::StatusOr<ClusterCredential> credential =
      ClusterCredential::Load(c.cluster_token_file, c.insecure_cluster);
  if (!credential.ok()) {
    std::fprintf(stderr, "%s: %s\n", kName, std::string(credential.status().message()).c_str());
    return 2;
  }
  spdlog::info("{} (cluster protocol version {})", kName, kClusterProtocolVersion);
  for (const std::string& line : c.Describe()) spdlog::info("  {}", line);
  SetLoadProgressFile(c.load_progress_file);
  if (credential->insecure()) {
    spdlog::warn("--insecure_cluster: the GpuWorker service accepts unauthenticated calls");
  }

  // Stop signals are taken by one thread; every other thread, gRPC's included, is started after
  // this mask and inherits it.
  BlockStopSignals(Sigpipe::kIgnore);
  StopEvent stop;
  auto signal_thread = std::make_unique<StopSignalThread>(
      [&stop](int sig) { stop.Trigger(0, StopSignalName(sig)); });
  // A stop that cannot finish (a thread blocked in a collective or in joining a TP group whose
  // peer died) must not keep the process: after kStopGrace it ends with _exit.
  absl::Notification done;
  std::thread watchdog([&] {
    stop.Wait();
    if (!done.WaitForNotificationWithTimeout(kStopGrace)) {
      spdlog::error("stopping ({}) did not finish in {}: exiting now", stop.reason(),
                    absl::FormatDuration(kStopGrace));
      spdlog::default_logger()->flush();
      _exit(stop.exit_code());
    }
  });
  int exit_code = 0;
  {
    std::unique_ptr<metrics::Metrics> metrics;
    if (!c.metrics_listen.empty()) {
      metrics = std::make_unique<metrics::Metrics>();
      if (absl::Status st = metrics->Listen(c.metrics_listen); !st.ok()) {
        spdlog::error("--metrics_listen: {}", std::string(st.message()));
        stop.Trigger(1, "cannot serve metrics");
      } else {
        spdlog::info("serving metrics on {} (port {})", c.metrics_listen, metrics->port());
      }
    }
    std::unique_ptr<GpuWorkerServer> server;
    if (!stop.flag()->load()) {
      auto s = GpuWorkerServer::Start(c.listen, c.worker_id, *credential);
      if (!s.ok()) {
        spdlog::error("{}", std::string(s.status().message()));
        stop.Trigger(1, "cannot listen");
      } else {
        server = std::move(*s);
        spdlog::info("serving GpuWorker on {} (port {})", c.listen, server->port());
        if (!c.port_file.empty()) {  // written whole: readers never see a part
          const absl::Status w =
              WriteFileAtomically(c.port_file, absl::StrCat(server->port(), "\n"));
          if (!w.ok()) spdlog::warn("--port_file: {}", std::string(w.message()));
        }
      }
    }
    std::unique_ptr<CoordinatorClient> coordinator;
    std::thread heartbeat;
    StageRole role;
    NcclIds nccl_ids;
    bool have_role = false;
    if (server != nullptr && !c.coordinator.empty()) {
      coordinator = std::make_unique<CoordinatorClient>(c.coordinator, *credential);
      const std::string address = AdvertiseAddress(c, server->port());
      DeviceDescription device;
      device.host = Hostname();
      const absl::Time until = absl::Now() + absl::Milliseconds(c.coordinator_timeout_ms);
      auto r = coordinator->Register(c.worker_id, address, c.backend, device, until, stop.flag());
      if (!r.ok()) {
        spdlog::error("{}", std::string(r.status().message()));
        stop.Trigger(1, "registration failed");
      } else {
        role = *r;
        spdlog::info("registered as '{}' at {}: stage {} of {}, TP rank {} of {}, layers [{}, {})",
                     c.worker_id, address, role.stage, role.num_stages, role.tp_rank, role.tp_size,
                     role.first_layer, role.end_layer);
        const int interval_ms = std::max(50, role.heartbeat_interval_ms);
        heartbeat = std::thread([&, interval_ms] {
          absl::Time last_ok = absl::Now();
          while (!stop.WaitFor(absl::Milliseconds(interval_ms))) {
            auto hb = coordinator->Heartbeat(c.worker_id, StepProgress(),
                                             absl::Milliseconds(std::max(1000, interval_ms)));
            if (hb.ok() && !*hb) {
              // A TP rank (or a linked worker) exits 1 so that its supervisor restarts it: its
              // group is formed again only by every member's new process.
              const bool grouped = role.tp_size > 1 || role.links();
              stop.Trigger(grouped ? 1 : 0,
                           grouped ? "the coordinator no longer counts this worker (or a peer of "
                                     "its TP group or stage links) as a member: the groups must "
                                     "be formed anew"
                                   : "the coordinator no longer counts this worker as a member");
            } else if (hb.ok()) {
              last_ok = absl::Now();
            } else if (absl::Now() - last_ok > absl::Milliseconds(c.coordinator_timeout_ms)) {
              stop.Trigger(1,
                           absl::StrCat("the coordinator has been unreachable for ",
                                        c.coordinator_timeout_ms, " ms: ", hb.status().message()));
            }
          }
        });
        // TP rank 0 of a TP > 1 stage creates the group's id (cluster.proto, step 3).
        std::map<std::string, std::string> publish;
        absl::Status setup = absl::OkStatus();
        if (role.tp_size > 1 && role.tp_rank == 0) {
#ifdef SS_HAVE_CUDA
          if (c.backend == "cuda") {
            absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
            if (id.ok()) {
              publish[TpGroupName(role.stage)] = *id;
            } else {
              setup = id.status();
            }
          }
#endif
        }
        // Under the nccl stage transport each sending worker creates its link's id (3b).
        if (role.links() && !role.last_stage() && setup.ok()) {
#ifdef SS_HAVE_CUDA
          absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
          if (id.ok()) {
            publish[PpLinkName(role.stage, role.tp_rank)] = *id;
          } else {
            setup = id.status();
          }
#else
          setup = absl::UnimplementedError("stage_transport nccl: this build has no CUDA");
#endif
        }
        absl::StatusOr<RendezvousResult> met =
            setup.ok() ? coordinator->Rendezvous(
                             c.worker_id, publish,
                             until + absl::Milliseconds(c.coordinator_timeout_ms), stop.flag())
                       : absl::StatusOr<RendezvousResult>(setup);
        if (met.ok() && role.tp_size > 1) {
          auto it = met->nccl_ids.find(TpGroupName(role.stage));
          if (it == met->nccl_ids.end()) {
            met = absl::FailedPreconditionError(absl::StrCat("rendezvous: no NCCL id for stage ",
                                                             role.stage, "'s TP group '",
                                                             TpGroupName(role.stage), "'"));
          } else {
            nccl_ids.tp = it->second;
          }
        }
        if (met.ok() && role.links()) {
          for (auto [stage, to] : {std::pair{role.stage, &nccl_ids.link_out},
                                   std::pair{role.stage - 1, &nccl_ids.link_in}}) {
            if (stage < 0 || stage + 1 >= role.num_stages) continue;
            auto it = met->nccl_ids.find(PpLinkName(stage, role.tp_rank));
            if (it == met->nccl_ids.end()) {
              met = absl::FailedPreconditionError(
                  absl::StrCat("rendezvous: no NCCL id for the stage link '",
                               PpLinkName(stage, role.tp_rank), "'"));
              break;
            }
            *to = it->second;
          }
        }
        if (!met.ok()) {
          server->SetError(std::string(met.status().message()));
          spdlog::error("{}", std::string(met.status().message()));
        } else {
          for (const PeerWorker& p : met->peers) {
            if (p.stage == role.stage + 1 && p.tp_rank == role.tp_rank) {
              role.next_stage_address = p.address;
            }
          }
          have_role = true;
        }
      }
    } else if (server != nullptr) {
      role.worker_id = c.worker_id;
      role.stage = c.stage;
      role.num_stages = c.num_stages;
      role.first_layer = c.first_layer;
      role.end_layer = c.end_layer;
      role.tp_rank = c.tp_rank;
      role.tp_size = c.tp_size;
      role.experts = ExpertSlicesForRank(c.experts, c.tp_rank, c.tp_size);
      role.kv_block_tokens = c.kv_block_tokens;
      role.next_stage_address = c.next_stage;
      have_role = true;
      if (c.tp_size > 1) {
        absl::StatusOr<std::string> id = StandaloneNcclId(
            c, absl::Now() + absl::Milliseconds(c.coordinator_timeout_ms), stop.flag());
        if (id.ok()) {
          nccl_ids.tp = *id;
        } else {
          server->SetError(std::string(id.status().message()));
          spdlog::error("{}", std::string(id.status().message()));
          have_role = false;
        }
      }
    }
    if (have_role && !stop.flag()->load()) {
      auto on_group_broken = [&stop](const std::string& why) {
        stop.Trigger(1, absl::StrCat("a step may have left the TP group or a stage link out of "
                                     "step (",
                                     why, "): communicator aborted, it must be formed anew"));
      };
      auto stage = LoadStage(c, *credential, role, nccl_ids, metrics.get(), &server->inbox(),
                             stop.flag(), on_group_broken);
      if (!stage.ok()) {
        spdlog::error("start-up failed: {}", std::string(stage.status().message()));
        server->SetError(std::string(stage.status().message()));
      } else {
        server->SetStage(std::move(*stage));
        spdlog::info("ready");
      }
    }
    stop.Wait();
    exit_code = stop.exit_code();
    spdlog::info("stopping: {}", stop.reason());
    // Open Steps streams are cancelled at once; the grace is for unary calls in flight (gRPC
    // also waits it out while a client keeps an idle channel open).
    if (server != nullptr) server->Shutdown(absl::Milliseconds(500));
    if (heartbeat.joinable()) heartbeat.join();
  }
  done.Notify();
  watchdog.join();
  signal_thread.reset();  // joins it, if the stop came from elsewhere
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace
}  // namespace ss::gpu

int main(int argc, char** argv) { return ss::gpu::Main(argc, argv); }
