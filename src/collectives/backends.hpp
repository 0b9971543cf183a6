// Backend factories (internal).
#pragma once

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

}  // namespace ddp::detail
