#include "bench/expert_bench_lib.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "tests/tools/test_configs.h"

namespace ss::bench {
namespace {

namespace fs = std::filesystem;
using ss::expert::ExpertSliceView;

constexpr int64_t kFlashDim = 4096, kFlashInter = 2048;

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

void FillSynthetic(uint64_t seed, uint8_t* p, size_t n, bool scales) {
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t r = SplitMix(state);
    if (scales) r = (r & 0x0303030303030303ull) + 0x7878787878787878ull;  // 120..123
    std::memcpy(p + i, &r, 8);
  }
  for (; i < n; ++i) {
    const uint8_t b = static_cast<uint8_t>(SplitMix(state));
    p[i] = scales ? static_cast<uint8_t>(120 + b % 4) : b;
  }
}

int64_t ExpertBytes(int64_t dim, int64_t inter) { return 3 * (inter * dim / 2 + inter * dim / 32); }

ExpertSliceView SyntheticExpert::View() const {
  ExpertSliceView v;
  v.w1 = w1.data();
  v.w1_scale = w1s.data();
  v.w3 = w3.data();
  v.w3_scale = w3s.data();
  v.w2 = w2.data();
  v.w2_scale = w2s.data();
  v.w2_stride = inter / 2;
  v.w2_scale_stride = inter / 32;
  return v;
}

size_t SyntheticExpert::Bytes() const {
  return w1.size() + w1s.size() + w3.size() + w3s.size() + w2.size() + w2s.size();
}

std::vector<SyntheticExpert> MakeExperts(int64_t count, int64_t dim, int64_t inter, uint64_t seed) {
  std::vector<SyntheticExpert> out(count);
  for (int64_t e = 0; e < count; ++e) {
    SyntheticExpert& x = out[e];
    x.inter = inter;
    int piece = 0;
    for (auto* v : {&x.w1, &x.w1s, &x.w3, &x.w3s, &x.w2, &x.w2s}) {
      const bool scales = piece % 2 == 1;
      v->resize(scales ? inter * dim / 32 : inter * dim / 2);
      FillSynthetic(seed * 1000 + e * 6 + piece++, v->data(), v->size(), scales);
    }
  }
  return out;
}

double StreamReadGbps(ss::ThreadPool* pool, const uint8_t* data, size_t bytes, int passes) {
  const int parts = pool != nullptr ? pool->size() : 1;
  const size_t per = bytes / parts / 64 * 64;
  std::vector<uint64_t> sums(parts * 8, 0);  // a cache line per part
  // 64 bytes per step with a software prefetch 16 KB ahead: on Zen 5 this reads 37 GB/s on one
  // core where the same loop without the prefetch reads 30 (and 1 KB ahead 26, 4 KB 32).
  auto read = [&](int64_t part, int) {
    const uint8_t* p = data + part * per;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < per; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 16384), _MM_HINT_T0);
      uint64_t w[8];
      std::memcpy(w, p + i, 64);
      a0 += w[0] + w[4];
      a1 += w[1] + w[5];
      a2 += w[2] + w[6];
      a3 += w[3] + w[7];
    }
    sums[part * 8] += a0 + a1 + a2 + a3;
  };
  double best = 0.0;
  for (int pass = 0; pass < passes; ++pass) {
    const Clock::time_point t0 = Clock::now();
    if (pool != nullptr) {
      if (!pool->ParallelFor(parts, read).ok()) return 0.0;
    } else {
      read(0, 0);
    }
    best = std::max(best, static_cast<double>(per) * parts / SecondsSince(t0) / 1e9);
  }
  if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 42) std::printf(" ");
  return best;
}

std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed) {
  uint64_t state = seed;
  std::vector<uint16_t> x(n);
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller
    const double u1 = (static_cast<double>(SplitMix(state) >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = static_cast<double>(SplitMix(state) >> 11) / 9007199254740992.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    x[i] = Bf16Bits(static_cast<float>(r * std::cos(2 * M_PI * u2)));
    if (i + 1 < n) x[i + 1] = Bf16Bits(static_cast<float>(r * std::sin(2 * M_PI * u2)));
  }
  return x;
}

Routing RandomRouting(int64_t T, int64_t top_k, int64_t E, uint64_t seed) {
  uint64_t state = seed;
  Routing r;
  r.ids.resize(T * top_k);
  r.weights.resize(T * top_k);
  std::vector<int32_t> perm(E);
  std::vector<bool> used(E, false);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    float sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {  // a partial Fisher-Yates shuffle
      std::swap(perm[j], perm[j + SplitMix(state) % (E - j)]);
      r.ids[t * top_k + j] = perm[j];
      used[perm[j]] = true;
      sum += r.weights[t * top_k + j] =
          0.1f + 0.9f * static_cast<float>(SplitMix(state) >> 40) / static_cast<float>(1 << 24);
    }
    for (int64_t j = 0; j < top_k; ++j) r.weights[t * top_k + j] *= 1.5f / sum;
  }
  r.distinct = std::count(used.begin(), used.end(), true);
  return r;
}

absl::StatusOr<KernelRun> TimeKernel(const ss::expert::ExpertKernel& kernel,
                                     const std::vector<SyntheticExpert>& experts, int64_t dim,
                                     int64_t tokens, int64_t top_k, int repeats,
                                     const std::vector<std::vector<int32_t>>& id_sets) {
  std::vector<ExpertSliceView> views;
  for (const SyntheticExpert& e : experts) views.push_back(e.View());
  const std::vector<uint16_t> x = RandomBf16(tokens * dim, 7);
  std::vector<float> weights(tokens * top_k, 0.25f), out(tokens * dim);
  ss::expert::ExpertCall call;
  call.num_tokens = tokens;
  call.dim = dim;
  call.top_k = top_k;
  call.inter_slice = experts.at(0).inter;
  call.x = x.data();
  call.expert_weights = weights.data();
  call.experts = views.data();
  call.num_experts = static_cast<int64_t>(views.size());
  call.swiglu_limit = 10.0f;
  call.out = out.data();
  std::vector<uint8_t> ws(ss::expert::ExpertWorkspaceBytes(call));
  KernelRun run;
  for (int r = 0; r < repeats; ++r) {
    const std::vector<int32_t>& ids = id_sets[r % id_sets.size()];
    call.expert_ids = ids.data();
    std::vector<bool> used(views.size(), false);
    int64_t distinct = 0;
    for (int32_t id : ids) distinct += !used[id], used[id] = true;
    run.bytes_per_call = distinct * static_cast<int64_t>(experts[0].Bytes());
    const Clock::time_point t0 = Clock::now();
    RETURN_IF_ERROR(kernel.run(call, ws.data(), ws.size()));
    run.seconds.push_back(SecondsSince(t0));
  }
  return run;
}

absl::Status EnsureFlashExpertCheckpoint(const std::string& dir, int layers, int experts,
                                         int64_t* generated_bytes) {
  *generated_bytes = 0;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": ", ec.message()));
  const std::string config = absl::StrReplaceAll(
      ss::testing_util::kFlashConfig,
      {{"\"n_routed_experts\": 256", absl::StrCat("\"n_routed_experts\": ", experts)}});
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (ReadFile(config_path) != config) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().filename().string().starts_with("model")) fs::remove(entry.path(), ec);
    }
    std::ofstream(config_path, std::ios::binary) << config;
  }
  const int64_t dim = kFlashDim, inter = kFlashInter;
  for (int l = 0; l < layers; ++l) {
    const std::string name = absl::StrFormat("model-layer-%02d.safetensors", l);
    if (fs::exists(fs::path(dir) / name)) continue;
    std::vector<TensorToWrite> tensors;
    for (int e = 0; e < experts; ++e) {
      const std::string p = absl::StrCat("layers.", l, ".ffn.experts.", e, ".");
      const struct {
        const char* name;
        DType dtype;
        int64_t rows, cols;
      } pieces[6] = {
          {"w1.weight", DType::kI8, inter, dim / 2}, {"w1.scale", DType::kF8E8M0, inter, dim / 32},
          {"w3.weight", DType::kI8, inter, dim / 2}, {"w3.scale", DType::kF8E8M0, inter, dim / 32},
          {"w2.weight", DType::kI8, dim, inter / 2}, {"w2.scale", DType::kF8E8M0, dim, inter / 32}};
      for (int i = 0; i < 6; ++i) {
        TensorToWrite t{p + pieces[i].name, pieces[i].dtype, {pieces[i].rows, pieces[i].cols}, {}};
        t.bytes.resize(pieces[i].rows * pieces[i].cols);
        FillSynthetic((static_cast<uint64_t>(l) * 4096 + e) * 8 + i, t.bytes.data(), t.bytes.size(),
                      pieces[i].dtype == DType::kF8E8M0);
        *generated_bytes += static_cast<int64_t>(t.bytes.size());
        tensors.push_back(std::move(t));
      }
    }
    const fs::path tmp = fs::path(dir) / (".tmp-" + name);
    RETURN_IF_ERROR(WriteSafetensors(tmp.string(), tensors));
    fs::rename(tmp, fs::path(dir) / name, ec);
    if (ec) return absl::InternalError(absl::StrCat(tmp.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    if (!log_path.empty()) {
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  auto c = std::unique_ptr<ChildProcess>(new ChildProcess());
  c->pid_ = pid;
  return c;
}

ChildProcess::~ChildProcess() { Stop(); }

bool ChildProcess::Alive() {
  if (pid_ <= 0) return false;
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) {
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    pid_ = -1;
    return false;
  }
  return true;
}

int ChildProcess::Stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    pid_ = -1;
  }
  return status_;
}

namespace {
int64_t ProcKb(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(key)) return std::atoll(line.c_str() + key.size()) * 1024;
  }
  return 0;
}
}  // namespace

int64_t VmRssBytes(pid_t pid) { return ProcKb(absl::StrCat("/proc/", pid, "/status"), "VmRSS:"); }

int64_t AnonHugeBytes(pid_t pid) {
  return ProcKb(absl::StrCat("/proc/", pid, "/smaps_rollup"), "AnonHugePages:");
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t got;
      while ((got = ::read(fd, buf, sizeof buf)) > 0) reply.append(buf, static_cast<size_t>(got));
    }
  }
  ::close(fd);
  const size_t body = reply.find("\r\n\r\n");
  if (!reply.starts_with("HTTP/1.") || reply.find(" 200 ") > 12 || body == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("GET 127.0.0.1:", port, path, " failed"));
  }
  return reply.substr(body + 4);
}

double MetricValue(const std::string& page, const std::string& series) {
  size_t at = 0;
  while ((at = page.find(series, at)) != std::string::npos) {
    const bool line_start = at == 0 || page[at - 1] == '\n';
    at += series.size();
    if (line_start && at < page.size() && page[at] == ' ')
      return std::strtod(page.c_str() + at, nullptr);
  }
  return std::nan("");
}

ss::expert::shm::ShmServerOptions EmptyServerOptions(const std::string& name, absl::Duration spin,
                                                     int max_tokens) {
  ss::expert::shm::ShmServerOptions o;
  o.name = name;
  o.slots = 4;
  o.max_tokens = static_cast<uint32_t>(max_tokens);
  o.dim = kFlashDim;
  o.top_k = 6;
  o.spin = spin;
  return o;
}

absl::Status EmptyHandler(const ss::expert::shm::ExpertRequestView&, float*) {
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ss::expert::shm::ShmClient>> ConnectShm(
    const std::string& name, const ss::expert::shm::ShmClientOptions& options,
    absl::Duration wait) {
  const absl::Time give_up = absl::Now() + wait;
  while (true) {
    auto c = ss::expert::shm::ShmClient::Connect(name, options);
    if (c.ok() || absl::Now() > give_up) return c;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

ShmCaller::ShmCaller(std::unique_ptr<ss::expert::shm::ShmClient> client, int tokens, int dim,
                     int top_k)
    : x_(static_cast<size_t>(tokens) * dim, 0x3f80),
      ids_(static_cast<size_t>(tokens) * top_k, 1),
      weights_(static_cast<size_t>(tokens) * top_k, 0.25f),
      out_(static_cast<size_t>(tokens) * dim),
      in_{0, tokens, top_k, dim, x_.data(), ids_.data(), weights_.data()},
      client_(std::move(client)) {}

absl::Status ShmCaller::RoundTrip(int layer) {
  in_.layer = layer;
  return client_->Call(in_, out_.data(), absl::Now() + absl::Seconds(5));
}

}  // namespace ss::bench
