// The gateway's accepted TCP connections seen from their sockets, for what cpp-httplib 0.11 does
// not expose: a handler gets no socket (Request::is_connection_closed() came in a later release)
// and its server has no deadline on receiving a request, only on each read.
//
// A connection is named by its endpoints as httplib reports them on a Request (local port, peer
// address and port); its socket is found among the process's descriptors (/proc/self/fd). While
// httplib processes a request on a connection the socket stays open, so a descriptor found for a
// request's endpoints is that request's socket until the handler returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ss {

struct ConnectionEndpoints {
  int local_port = -1;
  std::string peer_addr;  // numeric, as httplib's Request::remote_addr
  int peer_port = -1;
  bool operator==(const ConnectionEndpoints&) const = default;
};

struct ConnectionSocket {
  int fd = -1;
  ConnectionEndpoints endpoints;
};

// Every connected TCP socket of this process whose local port is `local_port` (the listening
// socket itself has no peer and is left out). O(open descriptors).
std::vector<ConnectionSocket> ConnectionSockets(int local_port);

// True when `fd` is a connected TCP socket with these endpoints.
bool SocketHasEndpoints(int fd, const ConnectionEndpoints& endpoints);

// The socket of the connection with these endpoints; -1 when none is open.
int FindConnectionSocket(const ConnectionEndpoints& endpoints);

// The bytes the kernel has received on connected TCP socket `fd` since the connection began
// (TCP_INFO's tcpi_bytes_received), read or not; nullopt when the kernel does not report it.
std::optional<uint64_t> BytesReceived(int fd);

// True when the peer has closed or reset the connection: a read would return end-of-file or an
// error. Unread data (a pipelined request) counts as open. Never blocks.
bool PeerClosed(int fd);

// Ends a connection whose request body is left unread, after its response is written: shuts
// down the sending side (the client sees the response end) and reads and discards what the client
// still sends, until it closes, `max_bytes` were discarded or `max_time` passed. Closing with
// unread data would send a reset, which may destroy the response before the client reads it.
void LingeringShutdown(int fd, size_t max_bytes, std::chrono::milliseconds max_time);

}  // namespace ss
