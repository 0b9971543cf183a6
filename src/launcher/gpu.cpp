#include "launcher/gpu.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "launcher/options.hpp"

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

namespace {

// "0,1,3" -> 3; "" and "-1" (hide every device) -> 0.
int count_ids(const std::string& list) {
  if (list.empty() || list == "-1") return 0;
  int n = 0;
  size_t start = 0;
  for (;;) {
    size_t end = list.find(',', start);
    if (end != start && start < list.size()) ++n;
    if (end == std::string::npos) return n;
    start = end + 1;
  }
}

}  // namespace

std::optional<GpuCount> slurm_gpus(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* k) -> const std::string* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : &it->second;
  };
  if (!get("SLURM_JOB_ID") && !get("SLURM_JOBID")) return std::nullopt;
  if (const std::string* v = get("CUDA_VISIBLE_DEVICES"))
    return GpuCount{count_ids(*v), fmt::format("CUDA_VISIBLE_DEVICES={}", *v)};
  if (const std::string* v = get("SLURM_GPUS_ON_NODE"); v && !v->empty()) {
    int n = 0;
    try {
      n = std::max(0, std::stoi(*v));
    } catch (const std::exception&) {
    }
    return GpuCount{n, fmt::format("SLURM_GPUS_ON_NODE={}", *v)};
  }
  const char* ids = get("SLURM_STEP_ID") ? "SLURM_STEP_GPUS" : "SLURM_JOB_GPUS";
  if (const std::string* v = get(ids)) return GpuCount{count_ids(*v), fmt::format("{}={}", ids, *v)};
  return GpuCount{0, "Slurm gave this job no GPU: no CUDA_VISIBLE_DEVICES, SLURM_GPUS_ON_NODE or " + std::string(ids) +
                         "; ask for them with --gpus-per-node or --gres=gpu:N"};
}

GpuCount visible_gpus(bool slurm_aware) {
  if (slurm_aware)
    if (auto s = slurm_gpus(current_environment())) return *s;
  int n = gpu_count();
  return GpuCount{n, n > 0 ? "the CUDA driver" : "CUDA_VISIBLE_DEVICES, driver"};
}

}  // namespace ddprun
