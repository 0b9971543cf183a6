#include "launcher/gpu.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace ddprun {

namespace {
int count_in_this_process() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0) n = 0;
  return n;
}
}  // namespace

int gpu_count() {
  // An explicitly empty list hides every device, without loading the driver.
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && (std::string(v).empty() || std::string(v) == "-1"))
    return 0;
  // Ask in a child process, so that ddprun itself never holds a CUDA context (memory, and
  // a driver that must not be forked after initialisation).
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return 0;
  pid_t pid = fork();
  if (pid == 0) {
    int n = count_in_this_process();
    ssize_t w = write(fds[1], &n, sizeof n);
    _exit(w == sizeof n ? 0 : 1);
  }
  close(fds[1]);
  int n = 0;
  if (pid < 0 || read(fds[0], &n, sizeof n) != sizeof n) n = 0;
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  return n;
}

}  // namespace ddprun
