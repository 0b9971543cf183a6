// Ports for the tests' servers, picked as tests/testlib/ports.py (the Python twin) picks
// them: a port of the kernel's ephemeral range can be taken by any outgoing connection of
// this machine between the pick and the server's bind, so free_port() picks below that range,
// and below the ports ddprun derives from Slurm job ids (20000 and up: the Slurm tests' jobs
// bind them without a pick), and checks that nobody holds the port.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <stdexcept>

namespace ddp::test {

// Whether nobody holds `port` on any IPv4 address (port 0: the kernel picks; the port
// picked, else 0).
inline int bind_any(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

// A port nobody holds right now, below the ephemeral range and ddprun's Slurm ports when
// there is room there.
inline int free_port() {
  constexpr int kSlurmDerived = 20000;  // src/launcher/slurm.cpp derived_port
  int low = 32768, high = 60999;
  if (std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range"); !(f >> low >> high)) low = 32768;
  const int top = std::min(low, kSlurmDerived);
  thread_local std::mt19937 rng{std::random_device{}()};
  if (top - 10000 >= 1000)
    for (int i = 0; i < 200; ++i)
      if (int p = bind_any(std::uniform_int_distribution<int>(10000, top - 1)(rng))) return p;
  if (int p = bind_any(0)) return p;
  throw std::runtime_error("free_port: no port");
}

}  // namespace ddp::test
