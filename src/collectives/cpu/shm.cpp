#include "shm.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <new>
#include <random>

#include <fmt/format.h>

#include "ddp/error.hpp"

namespace ddp::detail {
namespace {

constexpr uint64_t kMagic = 0x6464702d73686d34ull;  // "ddp-shm4"

struct Header {
  uint64_t magic;
  uint32_t nlocal;
  uint32_t reserved;
  uint64_t ring_bytes;
  uint64_t flat_bytes;
  uint64_t slice_bytes;
  uint64_t slice_min;
  uint64_t total;
};

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1 << 20)); }

// "/dev/shm: 3.9 MiB free of 4.0 MiB", for errors about a segment that does not fit.
std::string dev_shm_space() {
  struct statvfs v {};
  if (statvfs("/dev/shm", &v) != 0) return "/dev/shm: free space unknown";
  return fmt::format("/dev/shm: {} free of {}", mib(static_cast<double>(v.f_bavail) * v.f_frsize),
                     mib(static_cast<double>(v.f_blocks) * v.f_frsize));
}

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

}  // namespace

void ring_bell(Bell& b) noexcept {
  b.seq.fetch_add(1, std::memory_order_seq_cst);
  if (b.sleepers.load(std::memory_order_seq_cst) > 0) futex(&b.seq, FUTEX_WAKE, INT_MAX, nullptr);
}

void wait_bell(Bell& b, uint32_t ticket, long timeout_us) noexcept {
  b.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (b.seq.load(std::memory_order_seq_cst) == ticket) {
    timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
    futex(&b.seq, FUTEX_WAIT, ticket, &ts);  // EAGAIN/ETIMEDOUT/EINTR: caller re-checks
  }
  b.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

std::unique_ptr<ShmSegment> ShmSegment::create(int nlocal, size_t ring_bytes, size_t flat_bytes,
                                               size_t slice_bytes, size_t slice_min) {
  std::unique_ptr<ShmSegment> s(new ShmSegment);
  s->nlocal_ = nlocal;
  s->slice_bytes_ = slice_bytes ? round_up(slice_bytes, 64) : 0;
  s->slice_min_ = s->slice_bytes_ ? slice_min : 0;
  s->ring_bytes_ = round_up(std::max<size_t>(ring_bytes, 4096), 64);
  s->flat_bytes_ = round_up(std::max<size_t>(flat_bytes, 64), 64);
  std::random_device rd;
  uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  s->name_ = fmt::format("/ddp-{}-{:016x}", getpid(), nonce);
  int fd = shm_open(s->name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw SystemError(fmt::format("shm_open({}) for the shared-memory transport", s->name_), errno);
  s->size_ = 0;
  s->layout(false);  // computes size_
  // Reserve every page now (this also sets the size): tmpfs allocates on first touch, so a
  // full /dev/shm would otherwise kill a rank with SIGBUS in the middle of a collective.
  int e;
  do {
    e = posix_fallocate(fd, 0, static_cast<off_t>(s->size_));
  } while (e == EINTR);
  if (e != 0) {
    close(fd);
    shm_unlink(s->name_.c_str());
    throw SystemError(fmt::format("cannot reserve {} ({} bytes) for shared-memory segment {} ({})",
                                  mib(static_cast<double>(s->size_)), s->size_, s->name_,
                                  dev_shm_space()),
                      e);
  }
  s->base_ = mmap(nullptr, s->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  e = errno;
  close(fd);
  if (s->base_ == MAP_FAILED) {
    s->base_ = nullptr;
    shm_unlink(s->name_.c_str());
    throw SystemError(fmt::format("mmap({}, {} bytes)", s->name_, s->size_), e);
  }
  s->layout(true);
  auto* h = static_cast<Header*>(s->base_);
  h->nlocal = static_cast<uint32_t>(nlocal);
  h->ring_bytes = s->ring_bytes_;
  h->flat_bytes = s->flat_bytes_;
  h->slice_bytes = s->slice_bytes_;
  h->slice_min = s->slice_min_;
  h->total = s->size_;
  h->magic = kMagic;
  return s;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, int nlocal) {
  std::unique_ptr<ShmSegment> s(new ShmSegment);
  s->name_ = name;
  s->unlinked_ = true;  // the creator owns the name
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) throw SystemError(fmt::format("shm_open({}) created by the host's first rank", name), errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(Header)) {
    close(fd);
    throw CollectiveError(fmt::format("shared-memory segment {} is truncated", name));
  }
  s->size_ = static_cast<size_t>(st.st_size);
  s->base_ = mmap(nullptr, s->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (s->base_ == MAP_FAILED) {
    s->base_ = nullptr;
    throw SystemError(fmt::format("mmap({})", name), e);
  }
  auto* h = static_cast<Header*>(s->base_);
  if (h->magic != kMagic || h->nlocal != static_cast<uint32_t>(nlocal) || h->total != s->size_)
    throw CollectiveError(fmt::format(
        "shared-memory segment {} does not match this job (magic/rank count/size differ)", name));
  s->nlocal_ = nlocal;
  s->ring_bytes_ = h->ring_bytes;
  s->flat_bytes_ = h->flat_bytes;
  s->slice_bytes_ = h->slice_bytes;
  s->slice_min_ = h->slice_min;
  s->layout(false);
  return s;
}

void ShmSegment::layout(bool init) {
  size_t off = round_up(sizeof(Header), 64);
  size_t ranks_off = off;
  off += sizeof(RankCtl) * nlocal_;
  size_t rings_off = off;
  off += sizeof(RingCtl) * nlocal_;
  off = round_up(off, 4096);
  size_t ring_data_off = off;
  off += ring_bytes_ * nlocal_;
  size_t flat_off = off;
  off += 2 * flat_bytes_ * nlocal_;
  off = round_up(off, 4096);
  size_t slice_off = off;
  off += slice_bytes_ * (nlocal_ + 1);
  if (!base_) {
    size_ = off;
    return;
  }
  auto* b = static_cast<uint8_t*>(base_);
  if (init) {
    for (int i = 0; i < nlocal_; ++i) new (b + ranks_off + i * sizeof(RankCtl)) RankCtl();
    for (int i = 0; i < nlocal_; ++i) new (b + rings_off + i * sizeof(RingCtl)) RingCtl();
  }
  ranks_ = reinterpret_cast<RankCtl*>(b + ranks_off);
  rings_ = reinterpret_cast<RingCtl*>(b + rings_off);
  ring_data_ = b + ring_data_off;
  flat_data_ = b + flat_off;
  slice_data_ = b + slice_off;
}

void ShmSegment::unlink() noexcept {
  if (!unlinked_) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

ShmSegment::~ShmSegment() {
  unlink();
  if (base_) munmap(base_, size_);
}

ShmLink::ShmLink(int peer, ShmSegment& seg, int out_local, int in_local, Bell* peer_bell,
                 Bell* my_bell)
    : Link(peer), seg_(seg), cap_(seg.ring_bytes()), peer_bell_(peer_bell), my_bell_(my_bell) {
  if (out_local >= 0) {
    out_ = &seg.ring(out_local);
    out_data_ = seg.ring_data(out_local);
  }
  if (in_local >= 0) {
    in_ = &seg.ring(in_local);
    in_data_ = seg.ring_data(in_local);
  }
}

size_t ShmLink::try_send(const uint8_t* p, size_t n) {
  uint64_t head = out_->head.load(std::memory_order_relaxed);
  uint64_t tail = out_->tail.load(std::memory_order_acquire);
  int64_t free = static_cast<int64_t>(cap_) - static_cast<int64_t>(head - tail);
  if (free <= 0 || n == 0) return 0;
  size_t pos = head % cap_;
  size_t k = std::min<size_t>({n, static_cast<size_t>(free), cap_ - pos});
  std::memcpy(out_data_ + pos, p, k);
  out_->head.store(head + k, std::memory_order_release);
  ring_bell(*peer_bell_);
  return k;
}

std::span<const uint8_t> ShmLink::peek() {
  uint64_t tail = in_->tail.load(std::memory_order_relaxed);
  uint64_t head = in_->head.load(std::memory_order_acquire);
  if (pad_pending_) {  // skip the sender's alignment padding once it has been published
    uint64_t a = (tail + 63) & ~uint64_t{63};
    if (head < a) return {};
    if (a != tail) {
      in_->tail.store(a, std::memory_order_release);
      ring_bell(*peer_bell_);
    }
    tail = a;
    pad_pending_ = false;
  }
  if (head == tail) return {};
  size_t pos = tail % cap_;
  size_t k = std::min<size_t>(head - tail, cap_ - pos);
  return {in_data_ + pos, k};
}

void ShmLink::consume(size_t n) {
  uint64_t tail = in_->tail.load(std::memory_order_relaxed);
  in_->tail.store(tail + n, std::memory_order_release);
  ring_bell(*peer_bell_);
}

void ShmLink::end_message() {
  if (out_) {
    uint64_t h = out_->head.load(std::memory_order_relaxed);
    uint64_t a = (h + 63) & ~uint64_t{63};
    if (a != h) {
      out_->head.store(a, std::memory_order_release);
      ring_bell(*peer_bell_);
    }
  }
  if (in_) pad_pending_ = true;
  (void)my_bell_;
  (void)seg_;
}

}  // namespace ddp::detail
