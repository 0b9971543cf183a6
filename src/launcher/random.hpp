// Random bits for names and nonces (run ids, temp folders, rendezvous nonces): getrandom(2),
// which costs one system call, where std::random_device probes the CPU first.
#pragma once

#include <sys/random.h>

#include <cstdint>
#include <random>

namespace ddprun {

inline uint64_t random_u64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof v)) return v;
  std::random_device rd;  // no getrandom (old kernel, seccomp): fall back
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace ddprun
