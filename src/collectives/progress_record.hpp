// The collective a libddp process is in, as ddprun reads it (docs/stacks.md): one small
// record per process in the file ddprun names in DDPRUN_PROGRESS_FILE, mapped into the
// worker's memory and written at every collective's start and end (a few stores: no
// system call), read by ddprun with pread when it shows the workers' stacks or looks for a
// hang. Header-only: the layout is the contract between libddp and ddprun.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

namespace ddp::detail {

struct ProgressRecord {
  static constexpr char kMagic[8] = {'d', 'd', 'p', 'p', 'r', 'o', 'g', '1'};
  enum Op : uint32_t { kNone = 0, kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier };
  enum BackendKind : uint32_t { kCpu = 0, kNccl = 1 };

  char magic[8];
  // Odd while the writer is between its two bumps: a reader that sees it odd, or changed
  // across its read, reads again (a sequence lock; one writer per process).
  std::atomic<uint64_t> version;
  uint64_t started;    // collectives started (numbered from 1: the one in flight is #started)
  uint64_t completed;  // collectives ended (== started when none is in flight)
  uint32_t op;         // the one in flight, else the last one
  uint32_t backend;
  uint64_t bytes;      // its message size (per rank)
  int64_t since_ns;    // CLOCK_MONOTONIC_COARSE (system-wide) when it started (no clock read at its end)
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(ProgressRecord) == 56);

inline const char* progress_op_name(uint32_t op) {
  switch (op) {
    case ProgressRecord::kAllReduce: return "all_reduce";
    case ProgressRecord::kBroadcast: return "broadcast";
    case ProgressRecord::kAllGather: return "all_gather";
    case ProgressRecord::kReduceScatter: return "reduce_scatter";
    case ProgressRecord::kBarrier: return "barrier";
    default: return "none";
  }
}

}  // namespace ddp::detail
