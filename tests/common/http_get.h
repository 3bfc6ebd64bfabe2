// A minimal blocking HTTP/1.0 GET over a loopback TCP socket, for tests that scrape /metrics.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace ss::testing_util {

// The whole response (status line, headers, body), or "" when the connection fails.
inline std::string HttpGet(int port, const std::string& path, const char* host = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host, &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) resp.append(buf, n);
  close(fd);
  return resp;
}

// A loopback TCP port that was free a moment ago (bound to port 0, then released).
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// A port for `splitserve up --port P`, which also takes P+1, P+2, ... for its children's
// metrics: the first of a block of 32 free ports, 32-aligned, drawn from [20000, 30000) (below
// the kernel's ephemeral range, so no socket bound to port 0 lands in it). Concurrent tests
// draw different blocks and never get each other's derived ports, as FreeLoopbackPort's
// neighbouring ephemeral ports could. 0 if no free block was found.
inline int FreeLoopbackPortBlock() {
  constexpr int kBlock = 32, kFirst = 20000, kBlocks = (30000 - kFirst) / kBlock;
  static unsigned state = static_cast<unsigned>(getpid()) * 2654435761u;
  for (int attempt = 0; attempt < 64; ++attempt) {
    state = state * 1664525u + 1013904223u;
    const int base = kFirst + static_cast<int>(state % kBlocks) * kBlock;
    bool free = true;
    for (int p = base; p < base + kBlock && free; ++p) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(p));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      close(fd);
    }
    if (free) return base;
  }
  return 0;
}

}  // namespace ss::testing_util
