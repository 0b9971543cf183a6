#include "launcher/numa.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "ddp/error.hpp"
#include "launcher/fileio.hpp"
#include "launcher/gpu.hpp"

namespace ddprun {

namespace {

int to_int(std::string_view s, std::string_view what) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    throw ddp::Error(fmt::format("{}: expected a number, read '{}'", what, s));
  return v;
}

std::set<int> intersect(const std::set<int>& a, const std::set<int>& b) {
  std::set<int> out;
  std::ranges::set_intersection(a, b, std::inserter(out, out.end()));
  return out;
}

// "0000:1A:00.0" (the CUDA driver) or "00000000:1a:00.0" (NVML) -> sysfs's "0000:1a:00.0".
std::string sysfs_pci_address(const std::string& id) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4)
    throw ddp::Error(fmt::format("'{}' is not a PCI address", id));
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, device, function);
}

// CPUs grouped by a key of each (its core, its cache), in key order.
template <class Key>
std::map<int, std::set<int>> group_by(const std::set<int>& cpus, Key key) {
  std::map<int, std::set<int>> out;
  for (int c : cpus) out[key(c)].insert(c);
  return out;
}

int min_of(const std::set<int>& s) { return s.empty() ? -1 : *s.begin(); }

}  // namespace

std::optional<NumaMode> numa_mode(std::string_view name) {
  if (name == "node") return NumaMode::kNode;
  if (name == "socket") return NumaMode::kSocket;
  if (name == "exclusive") return NumaMode::kExclusive;
  if (name == "core-complex") return NumaMode::kCoreComplex;
  return std::nullopt;
}

std::string bad_numa_mode(const std::string& source, const std::string& name) {
  return fmt::format("{}: expected node, socket, exclusive or core-complex, got '{}'", source, name);
}

std::set<int> parse_cpu_list(std::string_view text) {
  std::set<int> out;
  const std::string whole(text);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.find(',', start), text.size());
    std::string_view part = text.substr(start, end - start);
    start = end + 1;
    if (part.empty()) continue;
    size_t dash = part.find('-');
    int lo = to_int(part.substr(0, dash), "a CPU list");
    int hi = dash == std::string_view::npos ? lo : to_int(part.substr(dash + 1), "a CPU list");
    if (lo < 0 || hi < lo || hi - lo > 1 << 20) throw ddp::Error(fmt::format("'{}' is not a CPU list", whole));
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return out;
}

std::string cpu_list_text(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int lo = *it, hi = lo;
    for (++it; it != cpus.end() && *it == hi + 1; ++it) hi = *it;
    if (!out.empty()) out += ',';
    out += lo == hi ? std::to_string(lo) : fmt::format("{}-{}", lo, hi);
  }
  return out;
}

// ------------------------------------------------------------------ sysfs

const std::string& Sysfs::read(const std::string& rel) const {
  if (auto it = files_.find(rel); it != files_.end()) return it->second;
  const std::string path = root_ + "/" + rel;
  auto text = read_file(path, 1 << 16);
  if (!text) throw ddp::Error(fmt::format("cannot read {}: {}", path, ddp::errno_text(errno)));
  return files_.emplace(rel, std::move(*text)).first->second;
}

int Sysfs::numa_node_of_pci(const std::string& pci) const {
  const std::string rel = fmt::format("bus/pci/devices/{}/numa_node", sysfs_pci_address(pci));
  return std::max(0, to_int(read(rel), root_ + "/" + rel));  // -1: one node, no information
}

std::set<int> Sysfs::node_cpus(int node) const {
  return parse_cpu_list(read(fmt::format("devices/system/node/node{}/cpulist", node)));
}

std::set<int> Sysfs::possible_nodes() const { return parse_cpu_list(read("devices/system/node/possible")); }

int Sysfs::package_of(int cpu) const {
  const std::string rel = fmt::format("devices/system/cpu/cpu{}/topology/physical_package_id", cpu);
  return to_int(read(rel), root_ + "/" + rel);
}

std::set<int> Sysfs::core_siblings(int cpu) const {
  return parse_cpu_list(read(fmt::format("devices/system/cpu/cpu{}/topology/thread_siblings_list", cpu)));
}

std::set<int> Sysfs::last_level_cache_of(int cpu) const {
  if (auto it = llc_.find(cpu); it != llc_.end()) return it->second;
  namespace fs = std::filesystem;
  const std::string rel = fmt::format("devices/system/cpu/cpu{}/cache", cpu);
  int best = -1;
  std::set<int> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_ + "/" + rel, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("index")) continue;
    const std::string dir = rel + "/" + name;
    const std::string& type = read(dir + "/type");
    if (!type.starts_with("Unified") && !type.starts_with("Data")) continue;  // not an instruction cache
    int level = to_int(read(dir + "/level"), root_ + "/" + dir + "/level");
    if (level <= best) continue;
    best = level;
    out = parse_cpu_list(read(dir + "/shared_cpu_list"));
  }
  if (best < 0) throw ddp::Error(fmt::format("{}/{} lists no data cache", root_, rel));
  return llc_[cpu] = out;
}

// ------------------------------------------------------------------ the modes

namespace {

// The GPU's place among the GPUs of its NUMA node (their indices in CUDA's order), and how many.
std::pair<size_t, size_t> place_on_node(const Sysfs& sys, const std::vector<std::string>& gpus, size_t gpu, int node) {
  size_t before = 0, n = 0;
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (sys.numa_node_of_pci(gpus[i]) != node) continue;
    if (i < gpu) ++before;
    ++n;
  }
  return {before, n};
}

std::set<int> socket_cpus(const Sysfs& sys, const std::set<int>& node_cpus, const std::set<int>& allowed) {
  const int package = sys.package_of(min_of(node_cpus));
  std::set<int> out;
  for (int n : sys.possible_nodes()) {
    std::set<int> cpus = intersect(sys.node_cpus(n), allowed);
    if (!cpus.empty() && sys.package_of(min_of(cpus)) == package) out.insert(cpus.begin(), cpus.end());
  }
  return out;
}

std::set<int> exclusive_cpus(const Sysfs& sys, const std::set<int>& node_cpus, int node, std::pair<size_t, size_t> at) {
  auto cores = group_by(node_cpus, [&](int c) { return min_of(sys.core_siblings(c)); });
  const auto [index, gpus] = at;
  const size_t each = cores.size() / gpus, extra = cores.size() % gpus;
  if (each < 1)
    throw ddp::Error(fmt::format("NUMA node {} has {} physical core{} for its {} GPUs: too few to give each its own",
                                 node, cores.size(), cores.size() == 1 ? "" : "s", gpus));
  const size_t from = index * each + std::min(index, extra), to = from + each + (index < extra ? 1 : 0);
  std::set<int> out;
  auto it = std::next(cores.begin(), static_cast<std::ptrdiff_t>(from));
  for (size_t i = from; i < to; ++i, ++it) out.insert(it->second.begin(), it->second.end());
  return out;
}

std::set<int> core_complex_cpus(const Sysfs& sys, const std::set<int>& node_cpus, std::pair<size_t, size_t> at) {
  auto caches = group_by(node_cpus, [&](int c) { return min_of(sys.last_level_cache_of(c)); });
  std::vector<std::set<int>> order;
  for (auto& [first, cpus] : caches) order.push_back(cpus);
  // The fullest caches first; among equals, the lowest CPUs first.
  std::ranges::stable_sort(order, [](const auto& a, const auto& b) { return a.size() > b.size(); });
  return order[at.first % order.size()];
}

}  // namespace

std::set<int> numa_cpus(NumaMode mode, const Sysfs& sys, const std::vector<std::string>& gpus, size_t gpu,
                        const std::set<int>& allowed) {
  const int node = sys.numa_node_of_pci(gpus.at(gpu));
  const std::set<int> near = intersect(sys.node_cpus(node), allowed);
  if (near.empty())
    throw ddp::Error(fmt::format("none of NUMA node {}'s CPUs is among those ddprun may use ({})", node,
                                 cpu_list_text(allowed)));
  switch (mode) {
    case NumaMode::kNode: return near;
    case NumaMode::kSocket: return socket_cpus(sys, near, allowed);
    case NumaMode::kExclusive: return exclusive_cpus(sys, near, node, place_on_node(sys, gpus, gpu, node));
    case NumaMode::kCoreComplex: return core_complex_cpus(sys, near, place_on_node(sys, gpus, gpu, node));
  }
  return near;
}

// ------------------------------------------------------------------ the plan

namespace {

std::set<int> own_affinity() {
  std::set<int> out;
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    const size_t size = CPU_ALLOC_SIZE(n);
    if (sched_getaffinity(0, size, set) == 0) {
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(c, size, set)) out.insert(c);
      CPU_FREE(set);
      return out;
    }
    CPU_FREE(set);
    if (errno != EINVAL) break;
  }
  throw ddp::SystemError("sched_getaffinity", errno);
}

std::vector<std::string> visible_gpu_addresses(const std::map<std::string, std::string>& env, std::string& root) {
  auto hook = env.find("DDPRUN_TEST_SYSFS");  // tests: a made-up machine
  if (hook == env.end()) return gpu_pci_addresses();
  root = hook->second;
  std::vector<std::string> out;
  auto text = read_file(root + "/gpus");
  for (size_t at = 0; text && at < text->size();) {
    size_t end = std::min(text->find('\n', at), text->size());
    if (end > at) out.push_back(text->substr(at, end - at));
    at = end + 1;
  }
  return out;
}

}  // namespace

std::vector<std::set<int>> numa_binding_plan(const std::string& name, const std::string& source, int nproc,
                                             const std::map<std::string, std::string>& env) {
  auto mode = numa_mode(name);
  if (!mode) throw ddp::UsageError(bad_numa_mode(source, name));
  std::string root = "/sys";
  const std::vector<std::string> gpus = visible_gpu_addresses(env, root);
  if (gpus.empty())
    throw ddp::UsageError(fmt::format("{}: binds each worker to the CPUs near its GPU, but no GPU is visible "
                                      "(CUDA_VISIBLE_DEVICES, driver)",
                                      source));
  if (nproc > static_cast<int>(gpus.size()))
    throw ddp::UsageError(fmt::format("{}: {} workers but {} GPU{} visible: local rank {} has no GPU to bind near",
                                      source, nproc, gpus.size(), gpus.size() == 1 ? "" : "s", gpus.size()));
  const Sysfs sys(root);
  const std::set<int> allowed = own_affinity();
  std::vector<std::set<int>> plan;
  for (int lr = 0; lr < nproc; ++lr) {
    try {
      plan.push_back(numa_cpus(*mode, sys, gpus, static_cast<size_t>(lr), allowed));
    } catch (const ddp::Error& e) {
      throw ddp::UsageError(fmt::format("{}: local rank {} (GPU {}, {}): {}", source, lr, lr, gpus[lr], e.what()));
    }
  }
  return plan;
}

}  // namespace ddprun
