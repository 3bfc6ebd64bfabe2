#include "coordinator/connection_socket.h"

#include <dirent.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>

namespace ss {
namespace {

int Port(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// The endpoints of `fd` when it is a connected TCP socket with local port `local_port` (any
// local port when -1).
bool Endpoints(int fd, int local_port, ConnectionEndpoints* out) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return false;
  if (local_port >= 0 && Port(local) != local_port) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&peer), peer_len, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return false;
  }
  out->local_port = Port(local);
  out->peer_addr = host;
  out->peer_port = Port(peer);
  return true;
}

// Calls f(fd) for every open descriptor of this process (but the directory's own).
template <typename F>
void ForEachFd(F&& f) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = dirfd(dir);
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (!f(static_cast<int>(fd))) break;
  }
  closedir(dir);
}

}  // namespace

std::vector<ConnectionSocket> ConnectionSockets(int local_port) {
  std::vector<ConnectionSocket> out;
  ForEachFd([&](int fd) {
    ConnectionSocket s;
    if (Endpoints(fd, local_port, &s.endpoints)) {
      s.fd = fd;
      out.push_back(std::move(s));
    }
    return true;
  });
  return out;
}

bool SocketHasEndpoints(int fd, const ConnectionEndpoints& endpoints) {
  ConnectionEndpoints e;
  return Endpoints(fd, endpoints.local_port, &e) && e == endpoints;
}

int FindConnectionSocket(const ConnectionEndpoints& endpoints) {
  int found = -1;
  ForEachFd([&](int fd) {
    if (SocketHasEndpoints(fd, endpoints)) {
      found = fd;
      return false;
    }
    return true;
  });
  return found;
}

std::optional<uint64_t> BytesReceived(int fd) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received) {
    return std::nullopt;
  }
  return info.tcpi_bytes_received;
}

bool PeerClosed(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

void LingeringShutdown(int fd, size_t max_bytes, std::chrono::milliseconds max_time) {
  if (shutdown(fd, SHUT_WR) != 0) return;
  const auto deadline = std::chrono::steady_clock::now() + max_time;
  char buf[16384];
  size_t discarded = 0;
  while (discarded < max_bytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) break;
    discarded += static_cast<size_t>(n);
  }
}

}  // namespace ss
