// Element-wise reduction kernels of the CPU backend (internal).
#pragma once

#include <cstddef>

#include "ddp/types.hpp"

namespace ddp::detail {

// dst[i] = dst[i] op src[i]   (kAvg reduces as kSum; finish with avg_finish)
void reduce_inplace(DType t, ReduceOp op, void* dst, const void* src, size_t count);
// out[i] = a[i] op b[i]; out may not overlap a or b.
void reduce_into(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count);
// data[i] /= n (integer types: truncating division).
void avg_finish(DType t, void* data, size_t count, int n);
// An average of 16-bit floats is taken as NCCL takes it: each rank's values are multiplied
// by 1/n before the sum (the sum of n float16 values overflows long before their mean does).
// Every other type sums, then divides (avg_finish).
bool avg_scales_first(DType t);
// out[i] = in[i] * (1/n) for a 16-bit float type; out may be in.
void scale_for_avg(DType t, void* out, const void* in, size_t count, int n);

}  // namespace ddp::detail
