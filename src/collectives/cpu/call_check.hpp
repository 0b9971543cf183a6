// The call check of the CPU backend (internal): every rank must make the same collective
// calls in the same order. A call that differs between ranks (another collective, count,
// dtype, op or root, or a call that one rank skipped) would otherwise pair the bytes of two
// different calls: a wrong result, and left-over bytes on the links that make every later
// call of the group wrong too, with no error anywhere.
//
// Each call is described (CallDesc) and compared before its result is used:
//   - on the ring, the first 32 bytes a rank sends to its right neighbour in a call are its
//     description (CallHeader), checked by the receiver before any data;
//   - in the flat algorithm, each rank's slot begins with it (kFlatHeaderBytes), checked by
//     every peer once all have posted, before any data is read;
//   - a rank on one host that has waited a while publishes its description in shared memory
//     (RankCtl::call), and compares its peers': two ranks whose calls chose different
//     algorithms (flat and ring) would otherwise wait on each other until the timeout.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "ddp/types.hpp"
#include "shm.hpp"

namespace ddp::detail {

struct CallDesc {
  uint64_t seq = 0;   // the group's collectives, numbered from 1 (0: its set-up barrier)
  uint8_t kind = 0;   // ProgressRecord::Op
  uint8_t dtype = 0;  // DType
  uint8_t op = 0;     // ReduceOp (all_reduce, reduce_scatter)
  int32_t root = -1;  // broadcast
  uint64_t count = 0;

  // What a rank that destroyed its group after `calls` collectives sends in place of the
  // next call's header (kind kLeftGroup).
  static constexpr uint8_t kLeftGroup = 0xff;
  static CallDesc left(uint64_t calls) { return CallDesc{calls + 1, kLeftGroup, 0, 0, -1, 0}; }

  bool operator==(const CallDesc&) const = default;
  std::array<uint64_t, 3> words() const;
  static CallDesc from_words(const std::array<uint64_t, 3>& w);
  // "all_reduce (sum, 1000 x float32)", "broadcast (root 1, 8 x int64)", "barrier".
  std::string describe() const;
};

// What crosses the ring first in each call, then `skip` bytes of padding so that the data
// goes on aligned: at a cache line on shared memory, at a page of the stream for a large
// message over TCP (at an offset of 32 bytes the copies cost up to a quarter more: 1 MiB
// all-reduces on shared memory, 256 KiB ones over loopback TCP).
struct CallHeader {
  static constexpr uint32_t kMagic = 0x6c6c6163;  // "call"
  static constexpr size_t kPaddedBytes = 4096;
  uint32_t magic = kMagic;
  uint32_t skip = 0;
  std::array<uint64_t, 3> words{};
};
static_assert(sizeof(CallHeader) == 32);
// Room for the header at the start of a flat slot: data of up to 32 bytes follows it in its
// cache line, longer data begins on the next one (cpu_group.cpp, flat_data).
inline constexpr size_t kFlatHeaderBytes = 64;

// Writes this rank's call into its record (a sequence lock: one writer, the rank itself).
void publish_call(RankCtl& me, const CallDesc& call) noexcept;
// A peer's published call; false while it is being rewritten, or before its first call.
bool read_call(const RankCtl& peer, CallDesc& out) noexcept;

// The error for a peer whose call differs from this rank's `mine`.
std::string call_mismatch(int peer, const CallDesc& theirs, const CallDesc& mine);

}  // namespace ddp::detail
