// NaN and infinity in tensors' stored bits, found by the loader (weights.cpp) in its one pass over the tensors.
#pragma once

#include "core/tensor.h"

#include <optional>
#include <span>

namespace jambo::model {

struct NonFiniteValue {
  size_t view = 0;     // which of the views
  int64_t index = 0;   // flat, into that view
  float value = 0.0f;  // NaN, inf or -inf
};

// The first element that is NaN or infinite, in the order of the views and of their elements. Reads the stored bits
// (F32, BF16 or F16) without converting them; the views' elements are shared among the OpenMP threads in one
// parallel loop.
std::optional<NonFiniteValue> find_nonfinite(std::span<const TensorView> views);

}  // namespace jambo::model
