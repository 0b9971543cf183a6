// A C++ worker's stack for ddprun (docs/stacks.md): under ddprun ($DDPRUN_STACK_FILE set,
// and SIGURG still at its default, ignored, so nobody else's handler is replaced), libddp
// announces itself in that file the way the Python bootstrap does, and on SIGURG writes the
// native backtrace of the thread the signal interrupted (the main thread, as a rule: the
// kernel offers a process's signal to it first) with glibc's backtrace, whose writing calls
// are async-signal-safe once it has been loaded (done here, up front). ddprun demangles
// and formats the frames when it reads them.
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "progress.hpp"

namespace ddp::detail {

namespace {

int g_fd = -1;

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

void on_dump_signal(int) {
  const int saved = errno;
  void* frames[64];
  const int n = backtrace(frames, 64);
  put("Native thread ");
  put_number(static_cast<long>(::syscall(SYS_gettid)));
  put(" (most recent call first):\n");
  if (n > 2) backtrace_symbols_fd(frames + 2, n - 2, g_fd);  // past this handler and the signal frame
  errno = saved;
}

}  // namespace

void arm_native_stack_dump() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("DDPRUN_STACK_FILE");
    if (!path || !*path) return;
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
    sa.sa_handler = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGURG, &sa, nullptr) != 0) return;
    char line[64];
    int len = std::snprintf(line, sizeof line, "ddprun-stacks pid=%d native\n", static_cast<int>(::getpid()));
    ssize_t r = ::write(fd, line, static_cast<size_t>(len));
    (void)r;
  });
}

}  // namespace ddp::detail
