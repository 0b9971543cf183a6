// Socket details shared by ddprun's store client and the launcher. Internal to src/.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace ddp::detail {

// Connecting to a port of this machine's ephemeral range while nobody listens there can
// connect the socket to itself (TCP's simultaneous open, when the kernel picks that very
// port as the local one): nothing answers, and the socket holds the port, so that the
// server that should listen there cannot bind it.
inline bool self_connected(int fd) {
  sockaddr_storage mine{}, peer{};
  socklen_t a = sizeof mine, b = sizeof peer;
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) == 0 &&
         ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) == 0 && a == b && std::memcmp(&mine, &peer, a) == 0;
}

// Closes a connected socket with a reset: no TIME_WAIT holds its port for a minute after.
inline void close_with_reset(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

}  // namespace ddp::detail
