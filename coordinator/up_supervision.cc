#include "coordinator/up_supervision.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/expert_store_format.h"
#include "common/stop_signals.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

constexpr std::chrono::milliseconds kStoppedGrace{1000};   // a child stopped this long is hung
constexpr std::chrono::milliseconds kProbeInterval{500};   // GET /ready while serving
constexpr std::chrono::milliseconds kNotReadyGrace{5000};  // /ready 503 this long: restart

std::string ReadFile(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void PrintBanner(const LaunchPlan& p, const std::string& model_name, int http_port,
                 std::chrono::steady_clock::duration took) {
  const UpOptions& o = p.o;
  const std::string url = absl::StrCat("http://", o.host, ":", http_port);
  const int children = static_cast<int>(p.gpu_ids.size()) + p.experts;
  std::printf(
      "splitserve up: ready in %.1f s: %s (%d stage(s) of TP %d, %s backend, %d expert "
      "worker(s)%s)\n"
      "  try:\n"
      "  curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
      "\"max_tokens\": 32}'\n"
      "  metrics: %s/metrics%s\n"
      "  Ctrl-C stops everything.\n",
      std::chrono::duration<double>(took).count(), url.c_str(), o.stages, o.tp, p.backend.c_str(),
      p.experts,
      o.stages > 1 ? absl::StrCat(", streams between stages over ", o.stage_transport).c_str() : "",
      url.c_str(), model_name.c_str(), url.c_str(),
      o.port == 0
          ? ""
          : absl::StrCat(" (workers: 127.0.0.1:", o.port + 1, "-", o.port + children, "/metrics)")
                .c_str());
  std::fflush(stdout);
}

}  // namespace

UpSupervision::UpSupervision(const LaunchPlan& plan, std::string model_name, Console* console,
                             LoadDisplay* load_display)
    : plan_(plan),
      model_name_(std::move(model_name)),
      console_(console),
      load_display_(load_display),
      child_out_(console != nullptr ? console->child_fd() : -1) {}

UpSupervision::~UpSupervision() = default;

void UpSupervision::UnlinkSegments() {
  for (const std::string& n : plan_.shm_names) {
    shm_unlink(("/" + n).c_str());
    shm_unlink(absl::StrCat("/", ExpertStoreSegmentName(n)).c_str());  // a killed worker's store
  }
}

// The workers: expert workers (fresh segments), then the GPU workers, which register with the
// coordinator at `control_port` and wait for the segments.
bool UpSupervision::StartWorkers(int control_port) {
  UnlinkSegments();
  load_display_->Restart(Clock::now());
  const UpOptions& o = plan_.o;
  for (int e = 0; e < plan_.experts; ++e) {
    if (!sup_.Start(absl::StrCat("expert", e), ExpertArgs(plan_, e), o.log_dir,
                    plan_.cpus.split() ? plan_.cpus.experts[e] : std::vector<int>{}, child_out_)) {
      return false;
    }
  }
  for (size_t i = 0; i < plan_.gpu_ids.size(); ++i) {
    if (!sup_.Start(plan_.gpu_ids[i], GpuWorkerArgs(plan_, i, control_port), o.log_dir,
                    plan_.cpus.serving, child_out_)) {
      return false;
    }
  }
  return true;
}

bool UpSupervision::StartCoordinator(int http_port) {
  unlink(plan_.ports_file.c_str());
  return sup_.Start("coordinator", CoordinatorArgs(plan_, http_port), plan_.o.log_dir,
                    plan_.cpus.serving, child_out_);
}

int UpSupervision::Run() {
  start_ = Clock::now();
  deadline_ = start_ + std::chrono::seconds(plan_.o.ready_timeout_s);
  if (!StartCoordinator(plan_.o.port)) {
    sup_.StopAll();
    UnlinkSegments();
    return 1;
  }
  int exit_code = 0;
  while (true) {
    if (WaitForStopSignal(absl::Milliseconds(100)) != 0) {
      load_display_->Stop(Clock::now(), false);
      if (served_) {
        std::printf("splitserve up: stopping (draining running requests)\n");
        std::fflush(stdout);
      }
      break;
    }
    const Clock::time_point now = Clock::now();
    const Failure f = Step(now);
    if (f.what.empty()) continue;
    if (!ScheduleRestart(now, f)) {
      exit_code = 1;
      break;
    }
  }
  sup_.StopAll();
  if (console_ != nullptr) console_->Stop();  // every child has ended: the relay copies the rest
  UnlinkSegments();
  if (served_) std::printf("splitserve up: stopped\n");
  return exit_code;
}

UpSupervision::Failure UpSupervision::Step(Clock::time_point now) {
  Failure f;
  if (const Supervisor::Child* c = sup_.Reap()) {
    f.what = absl::StrCat(c->name, " ", DescribeExit(c->status));
    f.all = c->name == "coordinator";
    f.child_failed = true;
  } else if (const Supervisor::Child* s = sup_.Stopped(kStoppedGrace)) {
    f.what = absl::StrCat(s->name, " (pid ", s->pid, ") is stopped");
    f.all = s->name == "coordinator";
    f.child_failed = true;
  } else if (phase_ == Phase::kBackoff && now >= restart_at_) {
    StepBackoff(now, &f);
  } else if (phase_ == Phase::kPorts) {
    StepPorts(now, &f);
  } else if (phase_ == Phase::kReady) {
    StepReady(now, &f);
  } else if (phase_ == Phase::kServing && now >= next_probe_) {
    StepServing(now, &f);
  }
  return f;
}

void UpSupervision::StepBackoff(Clock::time_point now, Failure* f) {
  const bool ok = restart_all_ ? StartCoordinator(http_port_) : StartWorkers(control_port_);
  phase_ = restart_all_ ? Phase::kPorts : Phase::kReady;
  deadline_ = now + std::chrono::seconds(plan_.o.ready_timeout_s);
  if (!ok) f->what = "a child could not be started";
}

void UpSupervision::StepPorts(Clock::time_point now, Failure* f) {
  const nlohmann::json j = nlohmann::json::parse(ReadFile(plan_.ports_file), nullptr, false);
  if (j.is_object() && j.contains("http") && j["http"].is_number_integer() &&
      j.contains("control") && j["control"].is_number_integer()) {
    http_port_ = j["http"].get<int>();
    control_port_ = j["control"].get<int>();
    client_ = std::make_unique<httplib::Client>(plan_.o.host, http_port_);
    client_->set_connection_timeout(1, 0);
    client_->set_read_timeout(1, 0);
    phase_ = Phase::kReady;
    if (!StartWorkers(control_port_)) f->what = "a child could not be started";
  } else if (now > deadline_) {
    f->what = "the coordinator did not start in time";
  }
}

void UpSupervision::StepReady(Clock::time_point now, Failure* f) {
  load_display_->Poll(now);
  if (auto res = client_->Get("/ready"); res && res->status == 200) {
    load_display_->Stop(now, true);
    phase_ = Phase::kServing;
    not_ready_since_ = {};
    if (!served_) {
      served_ = true;
      PrintBanner(plan_, model_name_, http_port_, now - start_);
    } else {
      std::printf("splitserve up: serving again %.2f s after the failure\n",
                  std::chrono::duration<double>(now - failed_at_).count());
      std::fflush(stdout);
    }
    policy_.OnRecovered();
  } else if (now > deadline_) {
    f->what = absl::StrCat("not ready after ", plan_.o.ready_timeout_s, " s (see the logs",
                           plan_.o.log_dir.empty() ? "" : " in ", plan_.o.log_dir, ")");
  }
}

void UpSupervision::StepServing(Clock::time_point now, Failure* f) {
  next_probe_ = now + kProbeInterval;
  auto res = client_->Get("/ready");
  if (res && res->status == 200) {
    not_ready_since_ = {};
  } else if (not_ready_since_ == Clock::time_point{}) {
    not_ready_since_ = now;
  } else if (now - not_ready_since_ > kNotReadyGrace) {
    f->what = res ? absl::StrCat("the coordinator has not been ready for ",
                                 absl::FormatDuration(absl::FromChrono(kNotReadyGrace)))
                  : "the coordinator does not answer";
    f->all = !res;
  }
}

bool UpSupervision::ScheduleRestart(Clock::time_point now, const Failure& f) {
  load_display_->Stop(now, false);
  // Before the first ready only a worker that died or stopped is restarted (under the same
  // backoff and burst limit): the coordinator failing to start, or nothing getting ready in
  // time, is a setup error to report at once.
  if (!served_ && (f.all || !f.child_failed)) {
    std::fprintf(stderr, "splitserve up: %s; stopping everything\n", f.what.c_str());
    return false;
  }
  const std::chrono::milliseconds delay = policy_.NextDelay();
  if (delay.count() < 0) {
    std::fprintf(stderr,
                 "splitserve up: %s; %d restarts in a row did not bring the cluster back: "
                 "giving up\n",
                 f.what.c_str(), RestartPolicy::kBurstLimit);
    return false;
  }
  if (phase_ == Phase::kServing) failed_at_ = now;
  restart_all_ = f.all || (restart_all_ && phase_ != Phase::kServing);
  std::fprintf(stderr, "splitserve up: %s; restarting %s in %.1f s (restart %d of %d in a row)\n",
               f.what.c_str(), restart_all_ ? "the coordinator and the workers" : "the workers",
               std::chrono::duration<double>(delay).count(), policy_.failed_in_a_row(),
               RestartPolicy::kBurstLimit);
  std::fflush(stderr);
  sup_.KillGroup("gpu");
  sup_.KillGroup("expert");
  if (restart_all_) sup_.KillGroup("coordinator");
  UnlinkSegments();
  phase_ = Phase::kBackoff;
  restart_at_ = now + delay;
  return true;
}

}  // namespace ss
