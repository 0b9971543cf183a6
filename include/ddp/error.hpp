// One error type family for libddp and ddprun. Every error carries the context a person
// needs to act on it: what failed, where (rank, host:port, key), the system's reason
// (errno text) and the time waited, already folded into what().
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

namespace ddp {

// Base of every error thrown by libddp and ddprun.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad command line or configuration: ddprun prints it and exits 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A system call failed; what() ends with ": <strerror(err)>".
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int err);
  int code() const noexcept { return err_; }

 private:
  int err_;
};

// Connecting to, reading from or writing to a peer failed (host:port in what()).
class NetworkError : public Error {
 public:
  using Error::Error;
};

// A blocking call ran past its deadline; what() names what was waited for and how long.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The store protocol was violated or the store refused a request.
class StoreError : public Error {
 public:
  using Error::Error;
};

// A collective failed (operation, rank, peer and cause in what()).
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// strerror_r wrapped: the system's text for an errno value.
std::string errno_text(int err);

// "1.5 s", "250 ms": a duration for error messages.
std::string format_duration(std::chrono::milliseconds d);

namespace detail {
// now + timeout, saturating: a timeout of milliseconds::max() (or of centuries) means no
// deadline, not an overflow into the past that fails at once.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
    return Clock::time_point::max();
  return now + timeout;
}
}  // namespace detail

}  // namespace ddp
