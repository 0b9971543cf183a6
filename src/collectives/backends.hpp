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
// effort, never the connect_timeout of a store that is gone. A store that answers takes
// milliseconds; one that died with its host (rank 0 without a launcher) refuses until the
// budget ends, and the CPU backend closes the rank's links only after it, so each rank of a
// TCP ring learnt of the loss one budget after its neighbour (2 s each: 14 s for 8 ranks).
inline constexpr std::chrono::milliseconds kAbortNoticeBudget{250};

// Base class constructor is protected; backends derive through this.
class GroupBase : public ProcessGroup {
 protected:
  using ProcessGroup::ProcessGroup;
};

}  // namespace ddp::detail
