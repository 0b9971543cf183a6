// Backend factories (internal).
#pragma once

#include <chrono>
#include <memory>

#include "ddp/process_group.hpp"

namespace ddp::detail {

std::unique_ptr<ProcessGroup> make_cpu_group(const ProcessGroupOptions& o);
std::unique_ptr<ProcessGroup> make_nccl_group(const ProcessGroupOptions& o);

// Base class constructor is protected; backends derive through this.
class GroupBase : public ProcessGroup {
 protected:
  using ProcessGroup::ProcessGroup;
};

// now + timeout, saturating: a timeout of milliseconds::max() (or of centuries) means no
// deadline, not an overflow into the past that fails at once.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now();
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
    return Clock::time_point::max();
  return now + timeout;
}

}  // namespace ddp::detail
