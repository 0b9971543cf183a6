// An in-process backend for tests: every MemoryBackend made from one MemoryWorld shares
// its state, logs and counters, like nodes sharing a store. Leases run on the world's fake
// clock (advance()), and a node's death is kill(); the world can also be taken down.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/backend.hpp"

namespace ddprun::rdzv {

class MemoryWorld : public std::enable_shared_from_this<MemoryWorld> {
 public:
  // A backend for one node (or one thread of it).
  std::unique_ptr<Backend> backend(const std::string& name = "memory");

  // Moves the fake clock on; leases not kept alive for their ttl end.
  void advance(milliseconds d);
  // Ends every lease opened by backends named `name` (the node died).
  void kill(const std::string& name);
  // While down, every call throws ddp::NetworkError (the backend is unreachable).
  void set_down(bool down);
  // Cuts the node `name` off (a partition): its keep-alives fail and do not renew its
  // lease, which then ends at the next advance() past its ttl.
  void cut_off(const std::string& name);

  // Whether trim_log drops lines (true) or refuses, as a store server without the extension.
  void set_trims(bool trims);

  // For assertions: the lines a log holds, and how many were dropped before them.
  std::vector<std::string> log(const std::string& name);
  size_t trimmed(const std::string& name);
  std::optional<std::string> state();
  // How many calls backends named `name` made (every thread's), a wait counting once.
  size_t calls(const std::string& name);

 private:
  friend class MemoryBackend;
  struct Lease {
    std::string owner;
    milliseconds ttl{0};
    std::chrono::steady_clock::time_point last;
    std::vector<std::pair<std::string, std::string>> lines;
    bool ended = false;
  };
  void end_lease(Lease& l, const std::string& why);  // mu_ held
  void check(const std::string& who);                // mu_ held: counts a call; throws when down
  void check_up(const std::string& who);             // mu_ held: throws when down

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> state_;
  uint64_t version_ = 0;
  std::map<std::string, std::vector<std::string>> logs_;  // the lines held
  std::map<std::string, size_t> trimmed_;                 // lines dropped before them
  bool trims_ = true;
  std::map<std::string, int64_t> counters_;
  std::map<int, Lease> leases_;
  int next_lease_ = 1;
  std::chrono::steady_clock::time_point now_{};
  bool down_ = false;
  std::set<std::string> cut_;
  std::map<std::string, size_t> calls_;
};

}  // namespace ddprun::rdzv
