// Shared-memory segment of the ranks on one host (internal to the CPU backend).
//
// Layout: header | RankCtl per local rank | RingCtl per local rank | ring data per local
// rank (rank i's ring carries i -> its right neighbour) | flat slots [2][nlocal] |
// slice staging areas [nlocal] | slice result area (the last two only when the slice
// all-reduce is enabled: slice_bytes > 0).
// Signalling: each rank has a doorbell (eventcount on a futex word) that peers ring after
// they make data or space available for it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "link.hpp"

namespace ddp::detail {

struct alignas(64) Bell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
};

// RankCtl::aborted: the rank failed (a peer must not use what it wrote since), or it destroyed
// its group between two collectives (what it wrote holds; it writes nothing more).
inline constexpr uint32_t kRankFailed = 1, kRankLeft = 2;

struct alignas(64) RankCtl {
  std::atomic<int32_t> pid{0};
  std::atomic<uint32_t> aborted{0};     // kRankFailed, kRankLeft (0: in the group)
  std::atomic<uint64_t> left_after{0};  // with kRankLeft: the collectives it made
  alignas(64) Bell bell;
  alignas(64) std::atomic<uint32_t> flat_posted{0};
  // The collective this rank waits in (CallDesc in call_check.hpp, as words), written when
  // it has waited a while, under a sequence lock: `call_version` is odd while the rank
  // rewrites `call`, so that a peer comparing it with its own call reads it whole or not at
  // all.
  alignas(64) std::atomic<uint32_t> call_version{0};
  std::atomic<uint64_t> call[3]{};
};

struct alignas(64) RingCtl {
  alignas(64) std::atomic<uint64_t> head{0};  // written by the sender
  alignas(64) std::atomic<uint64_t> tail{0};  // written by the receiver
};

// Wakes whoever sleeps on the bell.
void ring_bell(Bell& b) noexcept;
// Sleeps until the bell's seq differs from ticket or `timeout_us` passes.
void wait_bell(Bell& b, uint32_t ticket, long timeout_us) noexcept;

class ShmSegment {
 public:
  // Creates a new segment (name chosen here, see name()).
  // slice_bytes: stage size of the slice all-reduce (0: no slice areas); slice_min: the
  // creator's choice of the slice threshold, published to the other ranks (slice_min()).
  static std::unique_ptr<ShmSegment> create(int nlocal, size_t ring_bytes, size_t flat_bytes,
                                            size_t slice_bytes = 0, size_t slice_min = 0);
  // Maps an existing segment by name and checks its header.
  static std::unique_ptr<ShmSegment> open(const std::string& name, int nlocal);
  ~ShmSegment();

  const std::string& name() const { return name_; }
  // Removes the name (mappings stay valid). Idempotent, never throws.
  void unlink() noexcept;

  int nlocal() const { return nlocal_; }
  size_t ring_bytes() const { return ring_bytes_; }
  size_t flat_bytes() const { return flat_bytes_; }
  size_t slice_bytes() const { return slice_bytes_; }
  size_t slice_min() const { return slice_min_; }
  // Rank `local`'s staging area, and the shared result area, of the slice all-reduce.
  uint8_t* slice_in(int local) { return slice_data_ + static_cast<size_t>(local) * slice_bytes_; }
  uint8_t* slice_out() { return slice_data_ + static_cast<size_t>(nlocal_) * slice_bytes_; }
  RankCtl& rank(int local) { return ranks_[local]; }
  RingCtl& ring(int local) { return rings_[local]; }
  uint8_t* ring_data(int local) { return ring_data_ + static_cast<size_t>(local) * ring_bytes_; }
  uint8_t* flat_slot(uint32_t parity, int local) {
    return flat_data_ + (static_cast<size_t>(parity & 1u) * nlocal_ + local) * flat_bytes_;
  }

 private:
  ShmSegment() = default;
  void layout(bool init);

  std::string name_;
  bool unlinked_ = false;
  void* base_ = nullptr;
  size_t size_ = 0;
  int nlocal_ = 0;
  size_t ring_bytes_ = 0;
  size_t flat_bytes_ = 0;
  size_t slice_bytes_ = 0;
  size_t slice_min_ = 0;
  RankCtl* ranks_ = nullptr;
  RingCtl* rings_ = nullptr;
  uint8_t* ring_data_ = nullptr;
  uint8_t* flat_data_ = nullptr;
  uint8_t* slice_data_ = nullptr;
};

// Link over the segment: sends on ring `out_local` (this rank's ring), receives on ring
// `in_local` (the peer's ring); either may be -1 when unused in that direction.
class ShmLink : public Link {
 public:
  ShmLink(int peer, ShmSegment& seg, int out_local, int in_local, Bell* peer_bell, Bell* my_bell);
  const char* kind() const override { return "shared memory"; }
  size_t try_send(const uint8_t* p, size_t n) override;
  std::span<const uint8_t> peek() override;
  void consume(size_t n) override;
  void end_message() override;

 private:
  ShmSegment& seg_;
  RingCtl* out_ = nullptr;
  uint8_t* out_data_ = nullptr;
  RingCtl* in_ = nullptr;
  const uint8_t* in_data_ = nullptr;
  uint64_t cap_;
  Bell* peer_bell_;
  Bell* my_bell_;
  bool pad_pending_ = false;
};

}  // namespace ddp::detail
