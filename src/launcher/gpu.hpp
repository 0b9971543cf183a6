#pragma once

namespace ddprun {
// Number of CUDA devices visible to this process (CUDA_VISIBLE_DEVICES honoured by the
// driver). The driver is loaded at run time with dlopen: ddprun never links CUDA.
// 0 when there is no driver or no device.
int gpu_count();
}  // namespace ddprun
