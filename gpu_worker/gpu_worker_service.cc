#include "gpu_worker/gpu_worker_service.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cluster_protocol.h"
#include "proto/cluster.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace ss::gpu {

namespace pb = ::splitserve::v1;

namespace {

std::string VersionMismatch(const char* what, uint32_t got) {
  return absl::StrCat(what, " protocol version ", got, ", this worker speaks version ",
                      kClusterProtocolVersion);
}

pb::StepResult ErrorResult(uint64_t micro_batch_id, const std::string& error) {
  pb::StepResult r;
  r.set_micro_batch_id(micro_batch_id);
  r.set_error(error);
  return r;
}

// The results of one Steps stream: written from the executor thread, in order; the handler
// waits until every plan it submitted is answered before it returns (the stream must outlive
// the writes).
class ResultSink {
 public:
  explicit ResultSink(::grpc::ServerReaderWriter<pb::StepResult, pb::StepPlan>* stream)
      : stream_(stream) {}
  void Expect() {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  void Write(const pb::StepResult& r) {
    absl::MutexLock lock(&mu_);
    if (!broken_ && !stream_->Write(r)) broken_ = true;
    --pending_;
    cv_.SignalAll();
  }
  void WaitAll() {
    absl::MutexLock lock(&mu_);
    while (pending_ != 0) cv_.Wait(&mu_);
  }

 private:
  absl::Mutex mu_;
  absl::CondVar cv_;  // pending_ went down
  ::grpc::ServerReaderWriter<pb::StepResult, pb::StepPlan>* const stream_ ABSL_PT_GUARDED_BY(mu_);
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

class GpuWorkerServer::Impl final : public pb::GpuWorker::Service {
 public:
  Impl(std::string worker_id, ClusterCredential credential)
      : credential_(std::move(credential)), worker_id_(std::move(worker_id)) {
    executor_ = std::thread([this] { ExecutorLoop(); });
  }
  ~Impl() override { StopExecutor(); }

  absl::Status Listen(const std::string& listen) {
    ::grpc::ServerBuilder builder;
    builder.AddListeningPort(listen, ::grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    // Pings find a Steps peer that hung or vanished without closing its connection, so a
    // restarted coordinator can take over (the header's "One Steps stream at a time").
    const int keepalive_ms = static_cast<int>(absl::ToInt64Milliseconds(kKeepalive));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      return absl::UnavailableError(
          absl::StrCat("GpuWorker service: cannot listen on '", listen, "'"));
    }
    return absl::OkStatus();
  }

  ::grpc::Status Status(::grpc::ServerContext* ctx, const pb::StatusRequest* req,
                        pb::WorkerStatus* st) override {
    if (::grpc::Status auth = credential_.Check(*ctx, "GpuWorker.Status"); !auth.ok()) return auth;
    if (req->protocol_version() != kClusterProtocolVersion) {
      return ::grpc::Status(::grpc::StatusCode::FAILED_PRECONDITION,
                            VersionMismatch("Status request", req->protocol_version()));
    }
    absl::MutexLock lock(&mu_);
    st->set_protocol_version(kClusterProtocolVersion);
    st->set_worker_id(worker_id_);
    st->set_error(error_);
    if (stage_ != nullptr) {
      const BackendInfo info = stage_->backend->info();
      st->set_ready(true);
      st->set_kv_blocks(info.kv_tokens / stage_->kv_block_tokens);
      st->set_weight_bytes(info.weight_bytes);
      st->set_kv_bytes(info.kv_bytes);
    }
    return ::grpc::Status::OK;
  }

  ::grpc::Status Steps(::grpc::ServerContext* ctx,
                       ::grpc::ServerReaderWriter<pb::StepResult, pb::StepPlan>* stream) override {
    if (::grpc::Status auth = credential_.Check(*ctx, "GpuWorker.Steps"); !auth.ok()) return auth;
    {
      absl::MutexLock lock(&queue_mu_);
      const absl::Time handover_deadline = absl::Now() + kStepsHandover;
      while (live_steps_ != nullptr && !stopping_) {
        if (steps_cv_.WaitWithDeadline(&queue_mu_, handover_deadline)) break;
      }
      if (stopping_) {
        return ::grpc::Status(::grpc::StatusCode::UNAVAILABLE, "the worker is shutting down");
      }
      if (live_steps_ != nullptr) {
        spdlog::warn("refused a Steps stream from {}: the stream from {} is live", ctx->peer(),
                     live_steps_->peer());
        return ::grpc::Status(::grpc::StatusCode::FAILED_PRECONDITION,
                              "another Steps stream is open on this worker");
      }
      live_steps_ = ctx;
      streams_.insert(ctx);
      // A new stream starts with no sequences (cluster.proto): after the plans of any older
      // stream, free every sequence and drop streams pushed for micro-batches of the old one.
      queue_.push_back({pb::StepPlan(), nullptr});
      queue_cv_.Signal();
    }
    auto sink = std::make_shared<ResultSink>(stream);
    while (true) {
      pb::StepPlan plan;
      if (!stream->Read(&plan)) break;
      const bool shutdown = plan.shutdown();
      const uint64_t id = plan.micro_batch_id();
      sink->Expect();
      if (!Submit(std::move(plan), sink)) {
        sink->Write(ErrorResult(id, "the worker is shutting down"));
      }
      if (shutdown) break;
    }
    {
      absl::MutexLock lock(&queue_mu_);
      live_steps_ = nullptr;
      steps_cv_.SignalAll();
    }
    sink->WaitAll();
    absl::MutexLock lock(&queue_mu_);
    streams_.erase(ctx);
    return ::grpc::Status::OK;
  }

  ::grpc::Status PushStreams(::grpc::ServerContext* ctx, const pb::StageStreams* req,
                             pb::PushReply*) override {
    if (::grpc::Status auth = credential_.Check(*ctx, "GpuWorker.PushStreams"); !auth.ok()) {
      return auth;
    }
    if (req->protocol_version() != kClusterProtocolVersion) {
      return ::grpc::Status(::grpc::StatusCode::FAILED_PRECONDITION,
                            VersionMismatch("PushStreams", req->protocol_version()));
    }
    StageStreamsData d;
    d.rows = req->rows();
    d.width = req->width();
    d.error = req->error();
    if (d.error.empty()) {
      const int64_t elem = req->bf16() ? 2 : 4;
      if (d.rows < 0 || d.width < 0 ||
          static_cast<int64_t>(req->streams().size()) != d.rows * d.width * elem) {
        return ::grpc::Status(
            ::grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("streams: ", req->streams().size(), " bytes for [", d.rows, ", ", d.width,
                         "] ", req->bf16() ? "bf16" : "fp32"));
      }
      d.streams.resize(d.rows * d.width);
      if (req->bf16()) {
        UnpackBf16(req->streams(), d.streams.data());
      } else {
        std::memcpy(d.streams.data(), req->streams().data(), req->streams().size());
      }
    }
    const absl::Status st = inbox_.Put(req->micro_batch_id(), std::move(d));
    if (!st.ok()) {
      return ::grpc::Status(static_cast<::grpc::StatusCode>(st.code()), std::string(st.message()));
    }
    return ::grpc::Status::OK;
  }

  bool Submit(pb::StepPlan plan, std::shared_ptr<ResultSink> sink) {
    absl::MutexLock lock(&queue_mu_);
    if (stopping_) return false;
    queue_.push_back({std::move(plan), std::move(sink)});
    queue_cv_.Signal();
    return true;
  }

  void ExecutorLoop() {
    while (true) {
      Item item;
      bool stopping = false;
      {
        absl::MutexLock lock(&queue_mu_);
        while (!stopping_ && queue_.empty()) queue_cv_.Wait(&queue_mu_);
        if (queue_.empty()) return;  // stopping, nothing left
        item = std::move(queue_.front());
        queue_.pop_front();
        stopping = stopping_;
      }
      if (item.sink == nullptr) {
        absl::MutexLock stage_lock(&mu_);
        if (stage_ != nullptr) stage_->runner->ReleaseAll();
        inbox_.Clear();
        continue;
      }
      if (stopping) {
        item.sink->Write(ErrorResult(item.plan.micro_batch_id(), "the worker is shutting down"));
        continue;
      }
      StageRunner* runner = nullptr;
      std::string error, worker_id;
      {
        absl::MutexLock lock(&mu_);
        if (stage_ != nullptr) runner = stage_->runner.get();
        error = error_;
        worker_id = worker_id_;
      }
      if (runner == nullptr) {
        item.sink->Write(
            ErrorResult(item.plan.micro_batch_id(),
                        absl::StrCat("worker ", worker_id, " is not ready",
                                     error.empty() ? std::string() : absl::StrCat(": ", error))));
        continue;
      }
      const pb::StepResult r = runner->RunPlan(item.plan);
      if (!r.error().empty()) spdlog::warn("micro-batch {}: {}", r.micro_batch_id(), r.error());
      item.sink->Write(r);
    }
  }

  void StopExecutor() {
    {
      absl::MutexLock lock(&queue_mu_);
      stopping_ = true;
      queue_cv_.SignalAll();
      steps_cv_.SignalAll();
    }
    inbox_.Shutdown();
    if (executor_.joinable()) executor_.join();
  }

  void Shutdown(absl::Duration grace) {
    StopExecutor();
    {
      absl::MutexLock lock(&queue_mu_);
      for (::grpc::ServerContext* ctx : streams_) ctx->TryCancel();
    }
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
      server_->Wait();
      server_.reset();
    }
  }

  struct Item {
    pb::StepPlan plan;
    std::shared_ptr<ResultSink> sink;  // null: a reset marker (a new stream opened)
  };

  const ClusterCredential credential_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  // No lock: set by Listen before any call is served; server_ reset by Shutdown (the controlling
  // thread).
  std::unique_ptr<::grpc::Server> server_;
  int port_ = 0;
  StreamInbox inbox_;  // locks itself

  absl::Mutex mu_;
  std::unique_ptr<LoadedStage> stage_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);

  absl::Mutex queue_mu_;
  absl::CondVar queue_cv_;  // queue_ grew, or stopping_
  std::deque<Item> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::set<::grpc::ServerContext*> streams_ ABSL_GUARDED_BY(queue_mu_);  // open Steps streams
  // The stream still reading plans (at most one); the others only wait for their results.
  ::grpc::ServerContext* live_steps_ ABSL_GUARDED_BY(queue_mu_) = nullptr;
  absl::CondVar steps_cv_;  // live_steps_ became null, or stopping_
  std::thread executor_;
};

GpuWorkerServer::GpuWorkerServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GpuWorkerServer::~GpuWorkerServer() { Shutdown(absl::Seconds(1)); }

absl::StatusOr<std::unique_ptr<GpuWorkerServer>> GpuWorkerServer::Start(
    const std::string& listen, std::string worker_id, ClusterCredential credential) {
  auto impl = std::make_unique<Impl>(std::move(worker_id), std::move(credential));
  if (absl::Status st = impl->Listen(listen); !st.ok()) return st;
  return std::unique_ptr<GpuWorkerServer>(new GpuWorkerServer(std::move(impl)));
}

int GpuWorkerServer::port() const { return impl_->port_; }
StreamInbox& GpuWorkerServer::inbox() { return impl_->inbox_; }

void GpuWorkerServer::SetWorkerId(std::string worker_id) {
  absl::MutexLock lock(&impl_->mu_);
  impl_->worker_id_ = std::move(worker_id);
}

void GpuWorkerServer::SetStage(LoadedStage stage) {
  absl::MutexLock lock(&impl_->mu_);
  impl_->stage_ = std::make_unique<LoadedStage>(std::move(stage));
  impl_->error_.clear();
}

void GpuWorkerServer::SetError(std::string error) {
  absl::MutexLock lock(&impl_->mu_);
  impl_->error_ = std::move(error);
}

void GpuWorkerServer::Shutdown(absl::Duration grace) { impl_->Shutdown(grace); }

}  // namespace ss::gpu
