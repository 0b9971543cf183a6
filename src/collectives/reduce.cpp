// Reduction kernels written as plain loops over restrict pointers so that -O3 vectorises
// them; 16-bit floats go through float in blocks.
#include "reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ddp/error.hpp"

namespace ddp::detail {
namespace {

// Integer + and * wrap (done in the unsigned type: no undefined behaviour).
template <class T>
struct Sum {
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
template <class T>
struct Prod {
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::conditional_t<sizeof(T) < sizeof(unsigned), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
// Min and max propagate NaN (as torch's), whichever rank holds it: `b != b` only for a NaN.
template <class T>
struct Min {
  T operator()(T a, T b) const { return (b < a || b != b) ? b : a; }
};
template <class T>
struct Max {
  T operator()(T a, T b) const { return (a < b || b != b) ? b : a; }
};

template <class T, class F>
void loop_inplace(T* __restrict d, const T* __restrict s, size_t n) {
  F f;
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i], s[i]);
}
template <class T, class F>
void loop_into(T* __restrict o, const T* __restrict a, const T* __restrict b, size_t n) {
  F f;
  for (size_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
}

// 16-bit floats to float and back, n at a time. float16 uses the CPU's F16C instructions
// where it has them (x86-64 since 2012): the portable conversion, bit by bit, made a float16
// all-reduce 10-25x slower per byte than float32's. bfloat16's conversion is a shift and a
// rounding add that the compiler vectorises, with AVX2 where the CPU has it (twice SSE2's
// width). All round to nearest even.
// (Inlined always: compiled into a caller built for AVX2, the loop is AVX2's.)
template <class H>
[[gnu::always_inline]] inline void widen_portable(float* __restrict o, const H* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = in[i].to_float();
}
template <class H>
[[gnu::always_inline]] inline void narrow_portable(H* __restrict o, const float* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = H::from_float(in[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void widen_f16c(float* o, const Half* in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  widen_portable(o + i, in + i, n - i);
}
__attribute__((target("avx,f16c"))) void narrow_f16c(Half* o, const float* in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  narrow_portable(o + i, in + i, n - i);
}
__attribute__((target("avx2"))) void widen_avx2(float* o, const BFloat16* in, size_t n) { widen_portable(o, in, n); }
__attribute__((target("avx2"))) void narrow_avx2(BFloat16* o, const float* in, size_t n) { narrow_portable(o, in, n); }
struct CpuHas {
  bool f16c, avx2;
};
const CpuHas& cpu_has() {
  static const CpuHas has = [] {
    __builtin_cpu_init();  // (it may not have run yet when a static initializer asks)
    return CpuHas{__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx"), __builtin_cpu_supports("avx2") != 0};
  }();
  return has;
}
#else
struct CpuHas {
  bool f16c = false, avx2 = false;
};
const CpuHas& cpu_has() {
  static const CpuHas none;
  return none;
}
void widen_f16c(float*, const Half*, size_t) {}
void narrow_f16c(Half*, const float*, size_t) {}
void widen_avx2(float*, const BFloat16*, size_t) {}
void narrow_avx2(BFloat16*, const float*, size_t) {}
#endif

template <class H>
void widen(float* o, const H* in, size_t n) {
  if constexpr (std::is_same_v<H, Half>) {
    if (cpu_has().f16c) return widen_f16c(o, in, n);
  } else {
    if (cpu_has().avx2) return widen_avx2(o, in, n);
  }
  widen_portable(o, in, n);
}
template <class H>
void narrow(H* o, const float* in, size_t n) {
  if constexpr (std::is_same_v<H, Half>) {
    if (cpu_has().f16c) return narrow_f16c(o, in, n);
  } else {
    if (cpu_has().avx2) return narrow_avx2(o, in, n);
  }
  narrow_portable(o, in, n);
}

// 16-bit floats: convert a block to float, reduce, convert back.
constexpr size_t kHalfBlock = 512;
template <class H, class F>
void loop_half(H* o, const H* a, const H* b, size_t n) {
  float fa[kHalfBlock], fb[kHalfBlock];
  F f;
  for (size_t base = 0; base < n; base += kHalfBlock) {
    size_t m = std::min(kHalfBlock, n - base);
    widen(fa, a + base, m);
    widen(fb, b + base, m);
    for (size_t i = 0; i < m; ++i) fa[i] = f(fa[i], fb[i]);
    narrow(o + base, fa, m);
  }
}

template <template <class> class F>
void dispatch_into(DType t, void* out, const void* a, const void* b, size_t n, bool inplace) {
  auto go = [&](auto tag) {
    using T = decltype(tag);
    if (inplace)
      loop_inplace<T, F<T>>(static_cast<T*>(out), static_cast<const T*>(b), n);
    else
      loop_into<T, F<T>>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  };
  switch (t) {
    case DType::kFloat32: go(float{}); return;
    case DType::kFloat64: go(double{}); return;
    case DType::kInt32: go(int32_t{}); return;
    case DType::kInt64: go(int64_t{}); return;
    case DType::kUInt8: go(uint8_t{}); return;
    case DType::kFloat16:
      loop_half<Half, F<float>>(static_cast<Half*>(out), static_cast<const Half*>(a),
                                static_cast<const Half*>(b), n);
      return;
    case DType::kBFloat16:
      loop_half<BFloat16, F<float>>(static_cast<BFloat16*>(out), static_cast<const BFloat16*>(a),
                                    static_cast<const BFloat16*>(b), n);
      return;
  }
  throw Error("reduce: unknown dtype");
}

void dispatch(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t n,
              bool inplace) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: dispatch_into<Sum>(t, out, a, b, n, inplace); return;
    case ReduceOp::kProd: dispatch_into<Prod>(t, out, a, b, n, inplace); return;
    case ReduceOp::kMin: dispatch_into<Min>(t, out, a, b, n, inplace); return;
    case ReduceOp::kMax: dispatch_into<Max>(t, out, a, b, n, inplace); return;
  }
  throw Error("reduce: unknown reduce op");
}

template <class T>
void div_loop(T* __restrict d, size_t n, int k) {
  if constexpr (std::is_floating_point_v<T>) {
    const T kk = static_cast<T>(k);
    for (size_t i = 0; i < n; ++i) d[i] = d[i] / kk;
  } else {
    const T kk = static_cast<T>(k);
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / kk);
  }
}

template <class H>
void scale_half(H* o, const H* in, size_t n, int k) {
  const float by = 1.0f / static_cast<float>(k);
  float f[kHalfBlock];
  for (size_t base = 0; base < n; base += kHalfBlock) {
    size_t m = std::min(kHalfBlock, n - base);
    widen(f, in + base, m);
    for (size_t i = 0; i < m; ++i) f[i] *= by;
    narrow(o + base, f, m);
  }
}

}  // namespace

void reduce_inplace(DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  if (t == DType::kFloat16 || t == DType::kBFloat16)  // blockwise: aliasing out == a is fine
    dispatch(t, op, dst, dst, src, count, false);
  else
    dispatch(t, op, dst, nullptr, src, count, true);
}

void reduce_into(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count) {
  dispatch(t, op, out, a, b, count, false);
}

void avg_finish(DType t, void* data, size_t count, int n) {
  if (n == 1) return;
  switch (t) {
    case DType::kFloat32: div_loop(static_cast<float*>(data), count, n); return;
    case DType::kFloat64: div_loop(static_cast<double*>(data), count, n); return;
    case DType::kInt32: div_loop(static_cast<int32_t*>(data), count, n); return;
    case DType::kInt64: div_loop(static_cast<int64_t*>(data), count, n); return;
    case DType::kUInt8: div_loop(static_cast<uint8_t*>(data), count, n); return;
    case DType::kFloat16:
    case DType::kBFloat16: break;  // scaled before the sum: scale_for_avg
  }
  throw Error("reduce: 16-bit floats are averaged by scale_for_avg, not avg_finish");
}

bool avg_scales_first(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

void scale_for_avg(DType t, void* out, const void* in, size_t count, int n) {
  if (t == DType::kFloat16)
    scale_half(static_cast<Half*>(out), static_cast<const Half*>(in), count, n);
  else if (t == DType::kBFloat16)
    scale_half(static_cast<BFloat16*>(out), static_cast<const BFloat16*>(in), count, n);
  else
    throw Error("reduce: only 16-bit floats are scaled before an average");
}

}  // namespace ddp::detail
