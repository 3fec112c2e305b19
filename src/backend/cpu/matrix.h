// A dense row-major fp32 matrix: the activations of one step, one row per token.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <vector>

namespace jambo::cpu {

class Matrix {
 public:
  Matrix() = default;
  Matrix(int64_t num_rows, int64_t num_cols)
      : num_rows_(num_rows), num_cols_(num_cols), values_(size_t(num_rows * num_cols), 0.0f) {}

  int64_t num_rows() const { return num_rows_; }
  int64_t num_cols() const { return num_cols_; }
  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  float* row(int64_t index) { return values_.data() + element_offset(index, num_cols_); }
  const float* row(int64_t index) const { return values_.data() + element_offset(index, num_cols_); }

 private:
  int64_t num_rows_ = 0;
  int64_t num_cols_ = 0;
  std::vector<float> values_;  // [num_rows, num_cols]
};

}  // namespace jambo::cpu
