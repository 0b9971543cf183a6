#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {
// Number of CUDA devices visible to this process (CUDA_VISIBLE_DEVICES honoured by the
// driver). The driver is loaded at run time with dlopen: ddprun never links CUDA.
// 0 when there is no driver or no device.
int gpu_count();

// The PCI address of each CUDA device visible to this process, in CUDA's order, as the
// driver writes it ("0000:1A:00.0"); empty when there is no driver or no device.
std::vector<std::string> gpu_pci_addresses();

struct GpuCount {
  int n = 0;
  std::string from;  // where the count came from, for messages: "SLURM_GPUS_ON_NODE=4", "the CUDA driver"
};

// Inside a Slurm job (SLURM_JOB_ID set): the GPUs Slurm gave this step on this node, never
// the machine's: the entries of CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE, else the ids
// in SLURM_STEP_GPUS (inside a step) or SLURM_JOB_GPUS (batch script); none of them means
// none was given. nullopt outside Slurm.
std::optional<GpuCount> slurm_gpus(const std::map<std::string, std::string>& env);

// The entries of CUDA_VISIBLE_DEVICES in `env`, trimmed ("4, 5" -> 4 and 5); empty when it
// hides every device ("" or "-1"); nullopt when it is not set (every device is visible).
std::optional<std::vector<std::string>> visible_device_ids(const std::map<std::string, std::string>& env);

// The GPUs workers may use: slurm_gpus() of this process's environment when slurm_aware and
// inside a Slurm job, else gpu_count().
GpuCount visible_gpus(bool slurm_aware);
}  // namespace ddprun
