// Socket details shared by ddprun's store client and the launcher. Internal to src/.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>

#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44  // Linux 6.15's uapi; older headers lack it
#endif

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

// TCP doubles its wait between retransmissions (up to 2 minutes): data sent during a
// partition of a few seconds reaches the other side only seconds after the network came back
// (a partition of 7 s: at 13.5 s), and a lease judged by silence against a window of a few
// seconds was taken as lost although the network had returned within the window.
// Retransmitting at least every second (TCP_RTO_MAX_MS, Linux 6.15 and later; an older kernel
// keeps its backoff) brings it through within a second of the network's return. Retransmitting
// that often, the kernel would give a connection up after about 20 s without an answer:
// TCP_USER_TIMEOUT makes that `give_up`, longer than the caller's own deadlines, which judge.
// Returns false where the kernel has no bound.
inline bool bound_retransmit_backoff(int fd, std::chrono::milliseconds give_up) {
  const int max_rto_ms = 1000;  // the least the kernel accepts
  const auto ut = static_cast<unsigned>(std::clamp<int64_t>(give_up.count(), max_rto_ms, INT32_MAX));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
  return ::setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &max_rto_ms, sizeof max_rto_ms) == 0;
}

// A lease's connection (both ends): given up after twice the ttl and 5 s more, longer than
// the keeper's patience (the ttl and one interval).
inline bool bound_lease_retransmits(int fd, std::chrono::milliseconds ttl) {
  const auto capped = std::clamp<std::chrono::milliseconds>(ttl, std::chrono::milliseconds(0), std::chrono::hours(24));
  return bound_retransmit_backoff(fd, 2 * capped + std::chrono::seconds(5));
}

}  // namespace ddp::detail
