#include "call_check.hpp"

#include <fmt/format.h>

#include "../progress_record.hpp"

namespace ddp::detail {

std::array<uint64_t, 3> CallDesc::words() const {
  return {seq,
          uint64_t{kind} | uint64_t{dtype} << 8 | uint64_t{op} << 16 | uint64_t{static_cast<uint32_t>(root)} << 32,
          count};
}

CallDesc CallDesc::from_words(const std::array<uint64_t, 3>& w) {
  CallDesc d;
  d.seq = w[0];
  d.kind = static_cast<uint8_t>(w[1]);
  d.dtype = static_cast<uint8_t>(w[1] >> 8);
  d.op = static_cast<uint8_t>(w[1] >> 16);
  d.root = static_cast<int32_t>(static_cast<uint32_t>(w[1] >> 32));
  d.count = w[2];
  return d;
}

std::string CallDesc::describe() const {
  const char* name = progress_op_name(kind);
  const auto elems = fmt::format("{} x {}", count, dtype_name(static_cast<DType>(dtype)));
  switch (kind) {
    case ProgressRecord::kAllReduce:
      return fmt::format("{} ({}, {})", name, reduce_op_name(static_cast<ReduceOp>(op)), elems);
    case ProgressRecord::kBroadcast: return fmt::format("{} (root {}, {})", name, root, elems);
    case ProgressRecord::kAllGather: return fmt::format("{} ({} per rank)", name, elems);
    case ProgressRecord::kReduceScatter:
      return fmt::format("{} ({}, {} per rank)", name, reduce_op_name(static_cast<ReduceOp>(op)), elems);
    case ProgressRecord::kBarrier: return name;
  }
  return fmt::format("an unknown collective ({})", kind);
}

void publish_call(RankCtl& me, const CallDesc& call) noexcept {
  const uint32_t v = me.call_version.load(std::memory_order_relaxed);
  me.call_version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const auto w = call.words();
  for (size_t i = 0; i < w.size(); ++i) me.call[i].store(w[i], std::memory_order_relaxed);
  me.call_version.store(v + 2, std::memory_order_release);
}

bool read_call(const RankCtl& peer, CallDesc& out) noexcept {
  const uint32_t v = peer.call_version.load(std::memory_order_acquire);
  if (v == 0 || (v & 1)) return false;
  std::array<uint64_t, 3> w;
  for (size_t i = 0; i < w.size(); ++i) w[i] = peer.call[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (peer.call_version.load(std::memory_order_relaxed) != v) return false;
  out = CallDesc::from_words(w);
  return true;
}

std::string call_mismatch(int peer, const CallDesc& theirs, const CallDesc& mine) {
  constexpr const char* kRule =
      "every rank must make the same collective calls on a group, with the same count, dtype, op and root, in the "
      "same order";
  if (theirs.kind == CallDesc::kLeftGroup)
    return fmt::format("rank {} destroyed its process group after {} collective(s) where this rank is at #{}, {}: a "
                       "rank made fewer collective calls than the others ({})",
                       peer, theirs.seq - 1, mine.seq, mine.describe(), kRule);
  if (theirs.seq != mine.seq)
    return fmt::format("rank {} is at its collective #{} of this group, {}, where this rank is at #{}, {}: a rank "
                       "skipped a collective or made one more ({})",
                       peer, theirs.seq, theirs.describe(), mine.seq, mine.describe(), kRule);
  return fmt::format("rank {} called {} where this rank called {} (collective #{} of this group): {}", peer,
                     theirs.describe(), mine.describe(), mine.seq, kRule);
}

}  // namespace ddp::detail
