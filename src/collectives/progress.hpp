// libddp's side of the progress record (progress_record.hpp): the process's one record,
// mapped from $DDPRUN_PROGRESS_FILE on first use (or kept in memory when ddprun set none).
// DDP_PROGRESS_RECORD=0 turns it off (bench/ddp-bench/progress_ab.py measures its cost).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "progress_record.hpp"

namespace ddp::detail {

// Under ddprun, answers its stack requests (SIGURG) with this process's native backtrace
// (native_stack.cpp). Once per process; does nothing when ddprun asked for no stacks or
// SIGURG already has a handler.
void arm_native_stack_dump() noexcept;

// One writer at a time: the record has one writer's protocol (an odd version while it
// writes). Threads running collectives of their own groups at once take turns; one that
// finds another writing skips its update (the record then lags by that call) rather than
// tear the entry.
class Progress {
 public:
  static Progress& get();
  void begin(uint32_t op, uint32_t backend, uint64_t bytes) noexcept;
  void end() noexcept;

 private:
  Progress();
  ProgressRecord* rec_;
  bool on_ = true;
  std::atomic<bool> writing_{false};
};

}  // namespace ddp::detail
