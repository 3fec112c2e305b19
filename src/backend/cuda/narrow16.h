// The bf16 mode rounds every GEMM input to the weights' 16-bit type. A producer that knows its output feeds
// such GEMMs writes that rounded copy as it goes (a norm, SwiGLU, the scan), so that the GEMM needs no rounding
// pass of its own (a launch and a read and write of the input, per GEMM).
#pragma once

#include "core/dtype.h"
#include "core/host_device.h"

#include <cstdint>

namespace jambo::backend::cuda {

struct Narrow16 {
  uint16_t* data = nullptr;  // [rows, cols] contiguous, in dtype's bits; null: no copy
  DType dtype = DType::F32;  // BF16 or F16 when data is set

  JAMBO_HOST_DEVICE bool present() const { return data != nullptr; }
};

}  // namespace jambo::backend::cuda
