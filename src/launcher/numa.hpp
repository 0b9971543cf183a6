// --numa-binding (torchrun 2.9's modes): each worker runs on the CPUs near the GPU whose
// index is its local rank, read from sysfs. ddprun sets the affinity itself in the worker's
// child before exec (no numactl), and --preload's forked workers set it before they run.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

enum class NumaMode {
  kNode,         // every CPU of the GPU's NUMA node
  kSocket,       // every CPU of the NUMA nodes of the GPU's socket
  kExclusive,    // the GPU's share of its node's physical cores (the node's GPUs split them)
  kCoreComplex,  // one group of cores sharing a last-level cache, a different one per GPU of the node
};

// nullopt when the name is none of node, socket, exclusive, core-complex.
std::optional<NumaMode> numa_mode(std::string_view name);
// "--numa-binding: expected node, socket, exclusive or core-complex, got 'x'" (source: the flag as given).
std::string bad_numa_mode(const std::string& source, const std::string& name);

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}. parse_cpu_list throws ddp::Error when malformed.
std::set<int> parse_cpu_list(std::string_view text);
std::string cpu_list_text(const std::set<int>& cpus);

// The machine as sysfs shows it under `root` (the real one: /sys).
class Sysfs {
 public:
  explicit Sysfs(std::string root = "/sys") : root_(std::move(root)) {}
  int numa_node_of_pci(const std::string& pci) const;  // -1 (no NUMA information) reads as node 0
  std::set<int> node_cpus(int node) const;
  std::set<int> possible_nodes() const;
  int package_of(int cpu) const;
  std::set<int> core_siblings(int cpu) const;        // the logical CPUs of cpu's physical core
  std::set<int> last_level_cache_of(int cpu) const;  // the CPUs sharing cpu's largest data cache

 private:
  // Each file once (every local rank's plan asks the same ones); throws ddp::Error naming it.
  const std::string& read(const std::string& rel) const;
  std::string root_;
  mutable std::map<std::string, std::string> files_;
  mutable std::map<int, std::set<int>> llc_;  // last_level_cache_of, by CPU
};

// The CPUs the worker that uses gpus[gpu] is bound to: gpus are the PCI addresses of the
// visible GPUs in CUDA's order; only CPUs in `allowed` (ddprun's own affinity) count.
// Throws ddp::Error when that leaves none, or sysfs lacks what the mode needs.
std::set<int> numa_cpus(NumaMode mode, const Sysfs& sys, const std::vector<std::string>& gpus, size_t gpu,
                        const std::set<int>& allowed);

// Each local rank's CPUs for --numa-binding `name` (given as `source`, e.g. "--numa-binding
// node"), nproc workers. GPUs from the CUDA driver and sysfs at /sys (DDPRUN_TEST_SYSFS in env:
// that folder, with the GPUs' PCI addresses in its file `gpus`). Throws ddp::UsageError.
std::vector<std::set<int>> numa_binding_plan(const std::string& name, const std::string& source, int nproc,
                                             const std::map<std::string, std::string>& env);

}  // namespace ddprun
