// A C++ worker's stacks for ddprun (docs/stacks.md): under ddprun ($DDPRUN_STACK_FILE set,
// DDP_NATIVE_STACKS not 0, and SIGURG still at its default, ignored, so nobody else's
// handler is replaced), libddp
// announces itself in that file the way the Python bootstrap does, and on SIGURG writes the
// native backtrace of every thread: the thread the signal reached writes its own, then
// sends SIGURG to each other thread of the process (tgkill; the thread list read with raw
// getdents64), and each writes its own; a spin flag keeps the blocks whole. Only
// async-signal-safe calls: glibc's backtrace is loaded up front (its first call may
// allocate), and the writing is write(2). ddprun demangles and formats the frames.
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "progress.hpp"

namespace ddp::detail {

namespace {

int g_fd = -1;
std::atomic<bool> g_writing{false};  // one thread's block at a time

// Writes text and a decimal number without formatting calls (async-signal-safe).
void put(const char* s) {
  ssize_t r = ::write(g_fd, s, std::strlen(s));
  (void)r;
}
void put_number(long v) {
  char buf[24];
  int i = sizeof buf;
  buf[--i] = '\0';
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && i > 0);
  put(buf + i);
}

__attribute__((noinline)) void write_own_stack() {
  void* frames[64];
  const int n = backtrace(frames, 64);
  while (g_writing.exchange(true, std::memory_order_acquire)) {
  }
  put("Native thread ");
  put_number(static_cast<long>(::syscall(SYS_gettid)));
  put(" (most recent call first):\n");
  if (n > 3) backtrace_symbols_fd(frames + 3, n - 3, g_fd);  // past this function, the handler, the signal frame
  g_writing.store(false, std::memory_order_release);
}

struct LinuxDirent64 {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

// SIGURG to every other thread of this process (their handlers answer for themselves).
void ask_other_threads() {
  const int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  const long pid = ::getpid(), self = ::syscall(SYS_gettid);
  alignas(8) char buf[4096];
  for (;;) {
    const long got = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (got <= 0) break;
    for (long at = 0; at < got;) {
      auto* e = reinterpret_cast<LinuxDirent64*>(buf + at);
      at += e->reclen;
      long tid = 0;
      bool digits = e->name[0] != '\0';
      for (const char* c = e->name; *c; ++c) {
        if (*c < '0' || *c > '9') digits = false;
        tid = tid * 10 + (*c - '0');
      }
      if (digits && tid != self) ::syscall(SYS_tgkill, pid, tid, SIGURG);
    }
  }
  ::close(dir);
}

void on_dump_signal(int, siginfo_t* info, void*) {
  const int saved = errno;
  write_own_stack();
  // ddprun's signal asks every thread; one of ours (tgkill from this process) only answers.
  const bool from_us = info && info->si_code == SI_TKILL && info->si_pid == ::getpid();
  if (!from_us) ask_other_threads();
  errno = saved;
}

}  // namespace

void arm_native_stack_dump() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("DDPRUN_STACK_FILE");
    if (!path || !*path) return;
    // Off: the handler interrupts the program's own blocking calls that no SA_RESTART
    // restarts (poll, epoll_wait, sleep, nanosleep...) with EINTR, in every thread.
    if (const char* off = std::getenv("DDP_NATIVE_STACKS"); off && std::strcmp(off, "0") == 0) return;
    struct sigaction old {};
    if (sigaction(SIGURG, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    // Far above the descriptors the program opens (as the Python bootstrap does).
    int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 900);
    if (high >= 0) {
      ::close(fd);
      fd = high;
    }
    void* warm[1];
    backtrace(warm, 1);  // loads what backtrace needs now, not in the handler
    g_fd = fd;
    struct sigaction sa {};
    sa.sa_sigaction = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    if (sigaction(SIGURG, &sa, nullptr) != 0) return;
    char line[64];
    int len = std::snprintf(line, sizeof line, "ddprun-stacks pid=%d native\n", static_cast<int>(::getpid()));
    ssize_t r = ::write(fd, line, static_cast<size_t>(len));
    (void)r;
  });
}

}  // namespace ddp::detail
