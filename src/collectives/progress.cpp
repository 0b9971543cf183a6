#include "progress.hpp"

#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <new>

namespace ddp::detail {

namespace {

int64_t monotonic_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);  // the tick-cached clock: a few ns; tenths of seconds suffice
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// The file ddprun named, mapped shared; nullptr when there is none or it cannot be used.
ProgressRecord* map_file(const char* path) {
  int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (::ftruncate(fd, sizeof(ProgressRecord)) == 0)
    p = ::mmap(nullptr, sizeof(ProgressRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<ProgressRecord*>(p);
}

}  // namespace

Progress& Progress::get() {
  static Progress p;
  return p;
}

Progress::Progress() {
  arm_native_stack_dump();
  const char* off = std::getenv("DDP_PROGRESS_RECORD");
  on_ = !(off && std::strcmp(off, "0") == 0);
  const char* path = std::getenv("DDPRUN_PROGRESS_FILE");
  rec_ = path && *path ? map_file(path) : nullptr;
  if (!rec_) rec_ = new ProgressRecord{};  // recorded all the same: the cost never depends on ddprun
  std::memcpy(rec_->magic, ProgressRecord::kMagic, sizeof rec_->magic);
}

void Progress::begin(uint32_t op, uint32_t backend, uint64_t bytes) noexcept {
  if (!on_ || writing_.exchange(true, std::memory_order_acquire)) return;
  const uint64_t v = rec_->version.load(std::memory_order_relaxed);
  rec_->version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  ++rec_->started;
  rec_->op = op;
  rec_->backend = backend;
  rec_->bytes = bytes;
  rec_->since_ns = monotonic_ns();
  rec_->version.store(v + 2, std::memory_order_release);
  writing_.store(false, std::memory_order_release);
}

void Progress::end() noexcept {
  if (!on_ || writing_.exchange(true, std::memory_order_acquire)) return;
  const uint64_t v = rec_->version.load(std::memory_order_relaxed);
  rec_->version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  rec_->completed = rec_->started;
  rec_->version.store(v + 2, std::memory_order_release);
  writing_.store(false, std::memory_order_release);
}

}  // namespace ddp::detail
