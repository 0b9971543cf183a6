#include "launcher/guardian.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <new>

#include "launcher/process.hpp"

// Why the guardian shares ddprun's memory. A fork of ddprun copied its page tables and left
// every page that either side wrote afterwards to a copy-on-write fault: about a quarter of
// a single-node launch's CPU on a virtual machine, where faults and TLB flushes are dear
// (docs/benchmarks.md). A clone with CLONE_VM copies nothing. The price is care in the
// guardian: it runs on a stack of its own in ddprun's memory, so it calls no libc function
// that touches thread state (errno, cancellation, locks, malloc) and makes its system calls
// raw. It still has its own file table (it keeps only its pipe) and its own signal mask.
//
// Two cases keep the fork's copy of memory (clone without CLONE_VM, the same code):
// - architectures without the raw system call below;
// - kernels before 5.16, where a process that dumps core first kills every process that
//   shares its memory: a ddprun that aborted would take its guardian with it, and the
//   workers' own children would outlive both.

namespace ddprun {

namespace {

#if defined(__x86_64__)
constexpr bool kRawSyscalls = true;
long guard_syscall(long n, long a, long b, long c) {
  long ret;
  asm volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
constexpr bool kRawSyscalls = true;
long guard_syscall(long n, long a, long b, long c) {
  register long x8 asm("x8") = n;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
  return x0;
}
#else
constexpr bool kRawSyscalls = false;  // and so never in ddprun's memory: errno is its own
long guard_syscall(long n, long a, long b, long c) {
  long r = syscall(n, a, b, c);
  return r < 0 ? -errno : r;
}
#endif

constexpr size_t kStackBytes = 64 << 10;

struct GuardState {
  int fd;          // the read end of its pipe
  unsigned count;  // groups held, oldest first
  int32_t groups[Guardian::kMaxGroups];
};

// The list is moved through a volatile pointer: a plain loop becomes a call of libc's
// memmove (GCC does that at -O2), and nothing here may call into libc (above).
void drop_group(GuardState* s, unsigned at) {
  volatile int32_t* groups = s->groups;
  for (unsigned i = at + 1; i < s->count; ++i) groups[i - 1] = groups[i];
  --s->count;
}

void add_group(GuardState* s, int32_t g) {
  if (s->count == Guardian::kMaxGroups) drop_group(s, 0);  // the oldest goes
  s->groups[s->count++] = g;
}

void forget_group(GuardState* s, int32_t g) {
  unsigned i = s->count;
  while (i > 0 && s->groups[i - 1] != g) --i;  // the newest first: a number held twice was reused
  if (i > 0) drop_group(s, i - 1);
}

constexpr size_t kMemoryBytes = (sizeof(GuardState) + kStackBytes + 4095) / 4096 * 4096;

int guardian_main(void* arg) {
  auto* s = static_cast<GuardState*>(arg);
  guard_syscall(SYS_prctl, PR_SET_NAME, reinterpret_cast<long>("ddprun-guard"), 0);
#ifdef SYS_close_range
  // None of ddprun's files but its pipe: a console, a socket or a worker's pipe held here
  // would outlive ddprun. (Without close_range, before Linux 5.9, they stay open.)
  if (s->fd > 0) guard_syscall(SYS_close_range, 0, s->fd - 1, 0);
  guard_syscall(SYS_close_range, s->fd + 1, ~0U, 0);
#endif
  for (;;) {
    int32_t msg = 0;
    long n = guard_syscall(SYS_read, s->fd, reinterpret_cast<long>(&msg), sizeof msg);
    if (n == -EINTR) continue;
    if (n != sizeof msg) break;  // EOF: ddprun is gone
    if (msg == 0) return 0;      // disarmed
    if (msg > 0) add_group(s, msg);
    else forget_group(s, -msg);
  }
  for (unsigned i = 0; i < s->count; ++i) guard_syscall(SYS_kill, -s->groups[i], SIGKILL, 0);
  return 0;
}

// A 4-byte message: one write, atomic on a pipe.
void send(int fd, int32_t msg) {
  while (::write(fd, &msg, sizeof msg) < 0 && errno == EINTR) {
  }
}

}  // namespace

void Guardian::start() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;  // best effort: the death signal still covers workers
  void* mem = mmap(nullptr, kMemoryBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (mem == MAP_FAILED) {
    close(fds[0]);
    close(fds[1]);
    return;
  }
  auto* state = new (mem) GuardState;  // fresh anonymous memory: already zero, left untouched
  state->fd = fds[0];
  const int share = kRawSyscalls && kernel_at_least(5, 16) ? CLONE_VM : 0;
  // It keeps every signal blocked for its life: terminal signals sent to ddprun's group
  // stay pending there, and no handler of ddprun's ever runs on its stack.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = clone(guardian_main, static_cast<char*>(mem) + kMemoryBytes, share | SIGCHLD, state);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    munmap(mem, kMemoryBytes);
    return;
  }
  fd_ = fds[1];
  pid_ = pid;
  memory_ = mem;
}

void Guardian::watch(pid_t pgid) {
  if (fd_ >= 0) send(fd_, pgid);
}

void Guardian::forget(pid_t pgid) {
  if (fd_ >= 0 && pgid > 0) send(fd_, -pgid);
}

void Guardian::disarm() {
  if (fd_ < 0) return;
  send(fd_, 0);
  close(fd_);
  fd_ = -1;
  // Reaped if it already left (its memory then goes too); otherwise it exits on its own in
  // a moment (ddprun does not wait for it to be scheduled: that would cost every launch a
  // context switch), and its few pages stay mapped for ddprun's last moments.
  if (waitpid(pid_, nullptr, WNOHANG) == pid_) munmap(memory_, kMemoryBytes);
}

Guardian::~Guardian() { disarm(); }

}  // namespace ddprun
