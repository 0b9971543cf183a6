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

}  // namespace ddp::detail
