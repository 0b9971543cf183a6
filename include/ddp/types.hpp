// Element types and reduction operators of libddp's collectives, plus the two 16-bit
// floating-point storage types (IEEE half and bfloat16) with their float conversions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace ddp {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };

enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };

// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kUInt8: return 1;
  }
  return 0;
}

// "float32", "bfloat16", ...; "sum", "avg", ...
std::string_view dtype_name(DType t);
std::string_view reduce_op_name(ReduceOp op);

// IEEE 754 binary16, stored as bits (no arithmetic: convert to float).
struct Half {
  uint16_t bits = 0;

  static Half from_float(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)  // inf or nan (nan stays quiet)
      return Half{static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u))};
    if (ax >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
    if (ax < 0x38800000u) {  // half subnormal or zero: let the FPU round to units of 2^-24
      float a = std::bit_cast<float>(ax) + 0.5f;
      return Half{static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(a) - 0x3f000000u))};
    }
    uint32_t odd = (ax >> 13) & 1u;  // round half to even, rebias exponent 127 -> 15
    ax += 0xc8000fffu + odd;
    return Half{static_cast<uint16_t>(sign | (ax >> 13))};
  }

  float to_float() const {
    uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    uint32_t em = bits & 0x7fffu;
    if (em >= 0x7c00u) return std::bit_cast<float>(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em < 0x400u) {  // subnormal: em * 2^-24
      float v = static_cast<float>(em) * 5.9604644775390625e-8f;
      return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
    }
    return std::bit_cast<float>(sign | ((em << 13) + 0x38000000u));
  }
  friend bool operator==(Half a, Half b) { return a.bits == b.bits; }
};

// bfloat16: the upper half of an IEEE binary32.
struct BFloat16 {
  uint16_t bits = 0;

  static BFloat16 from_float(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((x >> 16) | 0x40u)};
    x += 0x7fffu + ((x >> 16) & 1u);  // round half to even
    return BFloat16{static_cast<uint16_t>(x >> 16)};
  }
  float to_float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
  friend bool operator==(BFloat16 a, BFloat16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

// The DType of a C++ element type: dtype_of<float>() == DType::kFloat32.
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DType::kFloat32;
  else if constexpr (std::is_same_v<U, double>) return DType::kFloat64;
  else if constexpr (std::is_same_v<U, Half>) return DType::kFloat16;
  else if constexpr (std::is_same_v<U, BFloat16>) return DType::kBFloat16;
  else if constexpr (std::is_same_v<U, int32_t>) return DType::kInt32;
  else if constexpr (std::is_same_v<U, int64_t>) return DType::kInt64;
  else if constexpr (std::is_same_v<U, uint8_t>) return DType::kUInt8;
  else static_assert(sizeof(U) == 0, "ddp: unsupported element type");
}

}  // namespace ddp
