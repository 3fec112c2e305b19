// A non-owning view of a weight tensor (row-major, any weight dtype) and the one helper through
// which every element offset is computed in 64 bits (DESIGN.md law 3).
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <string>
#include <vector>

namespace jambo {

// Law 3: the one place an offset into a weight, KV or state buffer is formed. Both factors are
// widened to int64_t before the multiply, so `slot * stride` can never wrap at 2^32.
inline int64_t element_offset(int64_t index, int64_t stride) { return index * stride; }

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // row-major; the last dimension is contiguous
  std::string name;            // checkpoint name, for error messages

  int64_t numel() const {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    return count;
  }
  int64_t rows() const { return shape.empty() ? 0 : numel() / shape.back(); }
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  bool empty() const { return data == nullptr; }

  // Element i of a flat view, converted to fp32 (for small vectors: norms, biases, A_log, D).
  float at(int64_t i) const {
    switch (dtype) {
      case DType::F32: return static_cast<const float*>(data)[i];
      case DType::BF16: return to_float(static_cast<const bf16*>(data)[i]);
      case DType::F16: return to_float(static_cast<const f16*>(data)[i]);
    }
    return 0.0f;
  }

  // Rows [first, first + count) of a 2-D (or stacked 3-D) view, as a 2-D view.
  TensorView row_slice(int64_t first, int64_t count) const {
    TensorView out = *this;
    out.data = static_cast<const char*>(data) + element_offset(first, cols() * dtype_size(dtype));
    out.shape = {count, cols()};
    return out;
  }
};

}  // namespace jambo
