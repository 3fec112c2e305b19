// Element types of weights and the conversions between them. Activations are always fp32.
#pragma once

#include "core/host_device.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace jambo {

enum class DType : uint8_t { F32, BF16, F16 };

JAMBO_HOST_DEVICE inline int64_t dtype_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

inline std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
  }
  return "?";
}

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float to_float(float value) { return value; }

// A float's bits and back, for host code and kernels alike.
JAMBO_HOST_DEVICE inline uint32_t float_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
#endif
}

JAMBO_HOST_DEVICE inline float float_from_bits(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
#endif
}

JAMBO_HOST_DEVICE inline float bf16_bits_to_float(uint16_t bits) { return float_from_bits(uint32_t(bits) << 16); }

// Round to nearest even, as PyTorch does; NaN stays NaN.
JAMBO_HOST_DEVICE inline uint16_t float_to_bf16_bits(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

inline float to_float(bf16 value) { return bf16_bits_to_float(value.bits); }

// IEEE half to float, exact for every value including subnormals, inf and NaN.
inline float to_float(f16 value) {
  const uint32_t sign = uint32_t(value.bits & 0x8000) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1f;
  const uint32_t mantissa = value.bits & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: value = mantissa * 2^-24
    bits = float_bits(float(mantissa) * (1.0f / 16777216.0f)) | sign;
  }
  return float_from_bits(bits);
}

inline bf16 to_bf16(float value) { return bf16{float_to_bf16_bits(value)}; }

// IEEE half from float, rounding to nearest even (subnormals, overflow to inf, NaN kept).
inline f16 to_f16(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return f16{uint16_t(sign | 0x7e00)};
  if (magnitude >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00)};  // rounds beyond 65504
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal, counted in units of 2^-24
    return f16{uint16_t(sign | uint16_t(std::nearbyint(std::fabs(value) * 16777216.0f)))};
  }
  uint32_t rebiased = magnitude - (112u << 23);  // exponent bias 127 -> 15
  rebiased += 0xfffu + ((rebiased >> 13) & 1u);
  return f16{uint16_t(sign | (rebiased >> 13))};
}

}  // namespace jambo
