// Where the recurrent state (conv tails and SSM states) is stored, and in which type: fp32 by default, or
// bf16 (CacheConfig::state_dtype), which halves the state pool. The state is computed in fp32 either way; a
// bf16 store rounds to nearest even, a load widens exactly. One definition for the CPU backend and the CUDA
// kernels, so that both round the same values alike.
#pragma once

#include "core/dtype.h"
#include "core/host_device.h"

#include <cstdint>

namespace jambo::backend {

// The storage types a state pool takes.
inline bool is_state_dtype(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16; }

// A stored value widened, and a value narrowed for storing, by storage type: float, or uint16_t holding bf16 bits
// (kernels whose storage type is fixed at compile time call these directly).
JAMBO_HOST_DEVICE inline float widen_state(float value) { return value; }
JAMBO_HOST_DEVICE inline float widen_state(uint16_t bits) { return bf16_bits_to_float(bits); }
JAMBO_HOST_DEVICE inline void narrow_state(float value, float& out) { out = value; }
JAMBO_HOST_DEVICE inline void narrow_state(float value, uint16_t& out) { out = float_to_bf16_bits(value); }

struct StateValues {
  void* data = nullptr;      // [count] values of dtype
  DType dtype = DType::F32;  // F32 or BF16

  // The values from element `offset` on (offsets in elements, 64-bit: law 3).
  JAMBO_HOST_DEVICE StateValues operator+(int64_t offset) const {
    return {static_cast<char*>(data) + offset * dtype_size(dtype), dtype};
  }
  JAMBO_HOST_DEVICE float get(int64_t i) const {
    return dtype == DType::F32 ? widen_state(static_cast<const float*>(data)[i])
                               : widen_state(static_cast<const uint16_t*>(data)[i]);
  }
  JAMBO_HOST_DEVICE void set(int64_t i, float value) const {
    if (dtype == DType::F32)
      narrow_state(value, static_cast<float*>(data)[i]);
    else
      narrow_state(value, static_cast<uint16_t*>(data)[i]);
  }
};

}  // namespace jambo::backend
