// libddp's side of the progress record (progress_record.hpp): the process's one record,
// mapped from $DDPRUN_PROGRESS_FILE on first use (or kept in memory when ddprun set none).
// DDP_PROGRESS_RECORD=0 turns it off (bench/ddp-bench/progress_ab.py measures its cost).
#pragma once

#include <cstddef>
#include <cstdint>

#include "progress_record.hpp"

namespace ddp::detail {

// Under ddprun, answers its stack requests (SIGURG) with this process's native backtrace
// (native_stack.cpp). Once per process; does nothing when ddprun asked for no stacks or
// SIGURG already has a handler.
void arm_native_stack_dump() noexcept;

class Progress {
 public:
  static Progress& get();
  void begin(uint32_t op, uint32_t backend, uint64_t bytes) noexcept;
  void end() noexcept;

 private:
  Progress();
  ProgressRecord* rec_;
  bool on_ = true;
};

}  // namespace ddp::detail
