#include "launcher/gpu.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "launcher/options.hpp"

namespace ddprun {

namespace {

// In a child process (ddprun itself never holds a CUDA context: memory, and a driver that
// must not be forked after initialisation): "N\n" then each device's PCI address, a line
// each, in CUDA's order; "" without a driver or device.
std::string ask_driver() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "";
  pid_t pid = fork();
  if (pid == 0) {
    std::string out;
    if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
      using InitFn = int (*)(unsigned);
      using CountFn = int (*)(int*);
      using GetFn = int (*)(int*, int);
      using BusIdFn = int (*)(char*, int, int);
      auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
      auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
      auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
      auto bus_id = reinterpret_cast<BusIdFn>(dlsym(lib, "cuDeviceGetPCIBusId"));
      int n = 0;
      if (init && count && init(0) == 0 && count(&n) == 0 && n > 0) {
        out = std::to_string(n) + "\n";
        for (int i = 0; i < n && get && bus_id; ++i) {
          char id[64] = {};
          int dev = 0;
          if (get(&dev, i) != 0 || bus_id(id, sizeof id, dev) != 0) break;
          out += std::string(id) + "\n";
        }
      }
    }
    _exit(write(fds[1], out.data(), out.size()) == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t r; pid > 0 && (r = read(fds[0], buf, sizeof buf)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  return out;
}

bool all_hidden() {  // an explicitly empty list hides every device, without loading the driver
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v && (std::string(v).empty() || std::string(v) == "-1");
}

}  // namespace

int gpu_count() {
  if (all_hidden()) return 0;
  try {
    return std::stoi(ask_driver());
  } catch (const std::exception&) {
    return 0;
  }
}

std::vector<std::string> gpu_pci_addresses() {
  std::vector<std::string> out;
  if (all_hidden()) return out;
  std::istringstream lines(ask_driver());
  std::string line;
  std::getline(lines, line);  // the count
  while (std::getline(lines, line)) out.push_back(line);
  return out;
}

namespace {

// "0, 1,3" -> 0, 1 and 3 (trimmed, empty entries dropped); "" and "-1" (hide every
// device) -> none.
std::vector<std::string> split_ids(const std::string& list) {
  std::vector<std::string> ids;
  if (list == "-1") return ids;
  std::istringstream in(list);
  for (std::string id; std::getline(in, id, ',');) {
    const size_t a = id.find_first_not_of(" \t"), b = id.find_last_not_of(" \t");
    if (a != std::string::npos) ids.push_back(id.substr(a, b - a + 1));
  }
  return ids;
}

int count_ids(const std::string& list) { return static_cast<int>(split_ids(list).size()); }

}  // namespace

std::optional<std::vector<std::string>> visible_device_ids(const std::map<std::string, std::string>& env) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end()) return std::nullopt;
  return split_ids(it->second);
}

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
