#include "proto/cluster_credential.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

constexpr char kMetadataKey[] = "authorization";
constexpr char kScheme[] = "Bearer ";
constexpr size_t kMaxTokenFileBytes = 4096;

bool Token68(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
         c == '~' || c == '+' || c == '/' || c == '=';
}

// Equal lengths compare in time independent of where the bytes differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

class TokenInterceptor final : public ::grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::shared_ptr<const std::string> header)
      : header_(std::move(header)) {}
  void Intercept(::grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            ::grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kMetadataKey, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<const std::string> header_;
};

class TokenInterceptorFactory final
    : public ::grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::shared_ptr<const std::string> header)
      : header_(std::move(header)) {}
  ::grpc::experimental::Interceptor* CreateClientInterceptor(
      ::grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(header_);
  }

 private:
  const std::shared_ptr<const std::string> header_;
};

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string what = absl::StrCat("--cluster_token_file ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(what) : absl::PermissionDeniedError(what);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_token_file ", path, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    spdlog::warn(
        "--cluster_token_file {}: mode {:o} lets other users read the cluster token "
        "(chmod 600 it)",
        path, st.st_mode & 0777);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(
        absl::StrCat("--cluster_token_file ", path, ": cannot be read"));
  }
  std::string text(kMaxTokenFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxTokenFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_token_file ", path, ": more than ", kMaxTokenFileBytes, " bytes"));
  }
  return text;
}

}  // namespace

// Refusals logged at most once a second; the ones in between are counted.
struct ClusterCredential::RefusalLog {
  absl::Mutex mu;
  std::chrono::steady_clock::time_point last ABSL_GUARDED_BY(mu){};
  uint64_t suppressed ABSL_GUARDED_BY(mu) = 0;
};

ClusterCredential::ClusterCredential() : log_(std::make_shared<RefusalLog>()) {}

absl::StatusOr<ClusterCredential> ClusterCredential::FromToken(absl::string_view token) {
  if (token.empty()) return absl::InvalidArgumentError("the cluster token is empty");
  if (token.size() < kMinTokenChars) {
    return absl::InvalidArgumentError(absl::StrCat("the cluster token has ", token.size(),
                                                   " characters; at least ", kMinTokenChars,
                                                   " are needed (e.g. `openssl rand -hex 32`)"));
  }
  for (char c : token) {
    if (!Token68(c)) {
      return absl::InvalidArgumentError(
          "the cluster token holds a character outside [A-Za-z0-9-._~+/=]");
    }
  }
  ClusterCredential c;
  c.header_ = std::make_shared<const std::string>(absl::StrCat(kScheme, token));
  return c;
}

ClusterCredential ClusterCredential::Insecure() {
  ClusterCredential c;
  c.insecure_ = true;
  return c;
}

absl::StatusOr<ClusterCredential> ClusterCredential::Load(const std::string& token_file,
                                                          bool insecure) {
  std::string token;
  std::string source;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> text = ReadTokenFile(token_file);
    if (!text.ok()) return text.status();
    token = std::string(absl::StripAsciiWhitespace(*text));
    source = absl::StrCat("--cluster_token_file ", token_file);
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(source, " is empty"));
  } else if (const char* env = std::getenv(kClusterTokenEnv); env != nullptr) {
    token = std::string(absl::StripAsciiWhitespace(env));
    source = kClusterTokenEnv;
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, " is set but empty"));
    }
  }
  if (insecure) {
    if (!source.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--insecure_cluster and a cluster token (", source, ") exclude each other"));
    }
    return Insecure();
  }
  if (source.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no cluster token: give --cluster_token_file PATH or set ", kClusterTokenEnv,
        " (the same token on every process of the cluster), or --insecure_cluster to accept "
        "unauthenticated calls"));
  }
  absl::StatusOr<ClusterCredential> c = FromToken(token);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", c.status().message()));
  return c;
}

std::string ClusterCredential::Describe() const {
  if (insecure_) return "insecure";
  return header_ != nullptr ? "token" : "none";
}

::grpc::Status ClusterCredential::Check(const ::grpc::ServerContext& context,
                                        absl::string_view method) const {
  if (insecure_) return ::grpc::Status::OK;
  const char* why = "no cluster token";
  if (header_ != nullptr) {
    const auto& md = context.client_metadata();
    auto it = md.find(kMetadataKey);
    if (it != md.end()) {
      if (ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), *header_)) {
        return ::grpc::Status::OK;
      }
      why = "a wrong cluster token";
    }
  } else {
    why = "this server has no cluster credential";
  }
  {
    absl::MutexLock lock(&log_->mu);
    const auto now = std::chrono::steady_clock::now();
    if (now - log_->last >= std::chrono::seconds(1)) {
      spdlog::warn("refused {} from {}: {}{}", std::string(method), context.peer(), why,
                   log_->suppressed == 0 ? std::string()
                                         : absl::StrCat(" (and ", log_->suppressed,
                                                        " more refusals since the last "
                                                        "line)"));
      log_->last = now;
      log_->suppressed = 0;
    } else {
      ++log_->suppressed;
    }
  }
  return ::grpc::Status(::grpc::StatusCode::UNAUTHENTICATED, "missing or wrong cluster token");
}

std::shared_ptr<::grpc::Channel> ClusterCredential::CreateChannel(
    const std::string& target, const ::grpc::ChannelArguments& args) const {
  std::vector<std::unique_ptr<::grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  if (header_ != nullptr) factories.push_back(std::make_unique<TokenInterceptorFactory>(header_));
  return ::grpc::experimental::CreateCustomChannelWithInterceptors(
      target, ::grpc::InsecureChannelCredentials(), args, std::move(factories));
}

std::shared_ptr<::grpc::Channel> ClusterCredential::CreateChannel(const std::string& target) const {
  return CreateChannel(target, ::grpc::ChannelArguments());
}

absl::StatusOr<std::string> GenerateClusterToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  token.reserve(2 * sizeof(bytes));
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

}  // namespace ss
