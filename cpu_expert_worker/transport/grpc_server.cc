#include "cpu_expert_worker/transport/grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/expert.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace ss::expert::grpc_transport {

namespace pb = ::splitserve::v1;

namespace {

::grpc::Status Bad(::grpc::StatusCode code, const std::string& message) {
  return ::grpc::Status(code, message);
}

// Checks one array field's byte size against its shape.
::grpc::Status CheckBytes(const char* field, size_t got, int64_t expected, const char* shape) {
  if (static_cast<int64_t>(got) == expected) return ::grpc::Status::OK;
  return Bad(::grpc::StatusCode::INVALID_ARGUMENT,
             absl::StrCat(field, ": ", got, " bytes, expected ", expected, " (", shape, ")"));
}

}  // namespace

class GrpcExpertServer::Impl final : public pb::ExpertService::Service {
 public:
  Impl(const GrpcServerOptions& options, shm::ExpertHandler handler)
      : options_(options), handler_(std::move(handler)) {
    sem_init(&stop_sem_, 0, 0);
  }
  ~Impl() override { sem_destroy(&stop_sem_); }

  absl::Status Start() {
    ::grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.listen_address, ::grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    // The largest request (x) and response (out) of max_tokens × dim, plus room for the rest.
    const int64_t max_bytes = static_cast<int64_t>(options_.max_tokens) * options_.dim * 4 +
                              static_cast<int64_t>(options_.max_tokens) * options_.top_k * 8 +
                              (1 << 16);
    const int limit = max_bytes > (1ll << 31) - 1 ? -1 : static_cast<int>(max_bytes);
    builder.SetMaxReceiveMessageSize(limit);
    builder.SetMaxSendMessageSize(limit);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      return absl::UnavailableError(
          absl::StrCat("gRPC expert server: cannot listen on '", options_.listen_address, "'"));
    }
    return absl::OkStatus();
  }

  ::grpc::Status Info(::grpc::ServerContext* context, const pb::InfoRequest*,
                      pb::InfoResponse* response) override {
    if (::grpc::Status auth = options_.credential.Check(*context, "ExpertService.Info");
        !auth.ok()) {
      return auth;
    }
    response->set_protocol_version(kGrpcProtocolVersion);
    response->set_dim(static_cast<int32_t>(options_.dim));
    response->set_max_tokens(static_cast<int32_t>(options_.max_tokens));
    response->set_top_k(static_cast<int32_t>(options_.top_k));
    for (int l : options_.layers) response->add_layers(l);
    response->set_slice_index(options_.slice_index);
    response->set_slice_count(options_.slice_count);
    return ::grpc::Status::OK;
  }

  ::grpc::Status Compute(::grpc::ServerContext* context, const pb::ExpertRequest* request,
                         pb::ExpertResponse* response) override {
    if (::grpc::Status auth = options_.credential.Check(*context, "ExpertService.Compute");
        !auth.ok()) {
      return auth;
    }
    calls_.fetch_add(1, std::memory_order_relaxed);
    ::grpc::Status st = Validate(*request);
    if (!st.ok()) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
    const absl::Time deadline = absl::FromChrono(context->deadline());
    // Serialise handler calls: wait (at most until the caller's deadline) to become the one
    // holder of `busy_`; the mutex itself is only held for the flag.
    mu_.Lock();
    if (!mu_.AwaitWithDeadline(absl::Condition(&IsIdle, &busy_), deadline)) {
      mu_.Unlock();
      rejected_.fetch_add(1, std::memory_order_relaxed);
      return Bad(::grpc::StatusCode::DEADLINE_EXCEEDED,
                 "the call's deadline passed while it waited for the expert engine");
    }
    busy_ = true;
    const uint64_t sequence = ++sequence_;
    mu_.Unlock();
    st = RunHandler(*request, sequence, deadline, response);
    mu_.Lock();
    busy_ = false;
    mu_.Unlock();
    return st;
  }

 private:
  static bool IsIdle(bool* busy) { return !*busy; }

  // Runs the handler on the validated request. Only the holder of busy_ touches the buffers.
  ::grpc::Status RunHandler(const pb::ExpertRequest& r, uint64_t sequence, absl::Time deadline,
                            pb::ExpertResponse* response) {
    const size_t t = static_cast<size_t>(r.tokens()), k = static_cast<size_t>(r.top_k()),
                 d = static_cast<size_t>(r.dim());
    x_.resize(t * d);
    ids_.resize(t * k);
    weights_.resize(t * k);
    out_.resize(t * d);
    std::memcpy(x_.data(), r.x_bf16().data(), r.x_bf16().size());
    std::memcpy(ids_.data(), r.ids().data(), r.ids().size());
    std::memcpy(weights_.data(), r.weights().data(), r.weights().size());
    shm::ExpertRequestView view;
    view.protocol_version = r.protocol_version();
    view.sequence = sequence;
    view.deadline = deadline;
    view.layer = r.layer();
    view.tokens = r.tokens();
    view.top_k = r.top_k();
    view.dim = r.dim();
    view.x_bf16 = x_.data();
    view.ids = ids_.data();
    view.weights = weights_.data();
    absl::Status hs;
    try {
      hs = handler_(view, out_.data());
    } catch (const std::exception& e) {
      hs = absl::InternalError(absl::StrCat("expert handler threw: ", e.what()));
    } catch (...) {
      hs = absl::InternalError("expert handler threw");
    }
    if (!hs.ok()) {
      handler_errors_.fetch_add(1, std::memory_order_relaxed);
      response->set_status_code(static_cast<int32_t>(hs.code()));
      response->set_message(std::string(hs.message()));
      return ::grpc::Status::OK;
    }
    response->set_status_code(0);
    response->set_out(reinterpret_cast<const char*>(out_.data()), out_.size() * sizeof(float));
    return ::grpc::Status::OK;
  }

  ::grpc::Status Validate(const pb::ExpertRequest& r) const {
    if (r.protocol_version() != kGrpcProtocolVersion) {
      return Bad(::grpc::StatusCode::FAILED_PRECONDITION,
                 absl::StrCat("expert request protocol version ", r.protocol_version(),
                              ", this server speaks version ", kGrpcProtocolVersion));
    }
    if (r.tokens() < 1 || static_cast<uint32_t>(r.tokens()) > options_.max_tokens) {
      return Bad(::grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("tokens ", r.tokens(), " outside [1, max_tokens ",
                              options_.max_tokens, "]"));
    }
    if (r.top_k() < 1 || static_cast<uint32_t>(r.top_k()) > options_.top_k) {
      return Bad(::grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("top_k ", r.top_k(), " outside [1, ", options_.top_k, "]"));
    }
    if (r.dim() < 1 || static_cast<uint32_t>(r.dim()) != options_.dim) {
      return Bad(::grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("dim ", r.dim(), ", this worker serves dim ", options_.dim));
    }
    const int64_t t = r.tokens(), k = r.top_k(), d = r.dim();
    ::grpc::Status st = CheckBytes("x_bf16", r.x_bf16().size(), t * d * 2, "tokens*dim*2");
    if (st.ok()) st = CheckBytes("ids", r.ids().size(), t * k * 4, "tokens*top_k*4");
    if (st.ok()) st = CheckBytes("weights", r.weights().size(), t * k * 4, "tokens*top_k*4");
    return st;
  }

 public:
  const GrpcServerOptions options_;
  const shm::ExpertHandler handler_;
  std::unique_ptr<::grpc::Server> server_;
  int port_ = 0;

  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a handler call is running
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Request copies (aligned for the handler) and the output; owned by the holder of busy_.
  std::vector<uint16_t> x_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<float> out_;

  sem_t stop_sem_;
  std::atomic<bool> stop_requested_{false};
  bool shut_down_ = false;  // controlling thread only
  std::atomic<uint64_t> calls_{0}, handler_errors_{0}, rejected_{0};
};

GrpcExpertServer::GrpcExpertServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<GrpcExpertServer>> GrpcExpertServer::Start(
    const GrpcServerOptions& options, shm::ExpertHandler handler) {
  if (options.max_tokens == 0 || options.dim == 0 || options.top_k == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gRPC expert server: max_tokens ", options.max_tokens, ", dim ", options.dim, ", top_k ",
        options.top_k, " must all be positive"));
  }
  if (options.slice_count < 1 || options.slice_index < 0 ||
      options.slice_index >= options.slice_count) {
    return absl::InvalidArgumentError(absl::StrCat("gRPC expert server: slice ",
                                                   options.slice_index, "/", options.slice_count));
  }
  if (!handler) return absl::InvalidArgumentError("gRPC expert server: no handler");
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status st = impl->Start(); !st.ok()) return st;
  return std::unique_ptr<GrpcExpertServer>(new GrpcExpertServer(std::move(impl)));
}

GrpcExpertServer::~GrpcExpertServer() { Stop(); }

void GrpcExpertServer::RequestStop() {
  if (!impl_->stop_requested_.exchange(true)) sem_post(&impl_->stop_sem_);
}

void GrpcExpertServer::Wait() {
  if (impl_->shut_down_) return;
  while (sem_wait(&impl_->stop_sem_) != 0 && errno == EINTR) {
  }
  impl_->shut_down_ = true;
  impl_->server_->Shutdown(absl::ToChronoTime(absl::Now() + impl_->options_.shutdown_grace));
  impl_->server_->Wait();
}

void GrpcExpertServer::Stop() {
  RequestStop();
  Wait();
}

int GrpcExpertServer::port() const { return impl_->port_; }

GrpcExpertServer::Stats GrpcExpertServer::stats() const {
  Stats s;
  s.calls = impl_->calls_.load(std::memory_order_relaxed);
  s.handler_errors = impl_->handler_errors_.load(std::memory_order_relaxed);
  s.rejected = impl_->rejected_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace ss::expert::grpc_transport
