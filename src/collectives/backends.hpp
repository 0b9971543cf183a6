// Backend factories (internal).
#pragma once

#include <chrono>
#include <memory>

#include "ddp/error.hpp"  // deadline_after
#include "ddp/process_group.hpp"

namespace ddp::detail {

std::unique_ptr<ProcessGroup> make_cpu_group(const ProcessGroupOptions& o);
std::unique_ptr<ProcessGroup> make_nccl_group(const ProcessGroupOptions& o);

// How long a failing rank tries to leave its notice in the store (StoreCallDeadline): best
// effort, never the connect_timeout of a store that is gone. (The CPU backend tries briefly
// first, raises its flag and closes its links, and only then tries for this long.)
inline constexpr std::chrono::milliseconds kAbortNoticeBudget{2000};

// Base class constructor is protected; backends derive through this.
class GroupBase : public ProcessGroup {
 protected:
  using ProcessGroup::ProcessGroup;
};

}  // namespace ddp::detail
