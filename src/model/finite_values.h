// NaN and infinity in a tensor's stored bits, found by the loader (weights.cpp) in its one pass over each tensor.
#pragma once

#include "core/tensor.h"

#include <optional>

namespace jambo::model {

struct NonFiniteValue {
  int64_t index = 0;   // flat, into the view
  float value = 0.0f;  // NaN, inf or -inf
};

// The view's first element that is NaN or infinite. Reads the stored bits (F32, BF16 or F16) without converting
// them; a long view is split among the OpenMP threads.
std::optional<NonFiniteValue> find_nonfinite(const TensorView& view);

}  // namespace jambo::model
