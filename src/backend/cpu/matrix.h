// A dense row-major fp32 matrix: the activations of one step, one row per token.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace jambo::backend::cpu {

// Leaves elements added by resize uninitialized: outputs that are fully overwritten need no memset.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

class Matrix {
 public:
  Matrix() = default;
  Matrix(int64_t num_rows, int64_t num_cols)  // zero-filled
      : num_rows_(num_rows), num_cols_(num_cols), values_(size_t(num_rows * num_cols), 0.0f) {}

  // Makes the matrix [num_rows, num_cols], reusing its storage; the values are unspecified, so
  // only for outputs that are fully overwritten. Buffers kept across steps and layers then cost
  // neither an allocation nor a zero-fill.
  void resize(int64_t num_rows, int64_t num_cols) {
    num_rows_ = num_rows;
    num_cols_ = num_cols;
    values_.resize(size_t(num_rows * num_cols));
  }

  int64_t num_rows() const { return num_rows_; }
  int64_t num_cols() const { return num_cols_; }
  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  float* row(int64_t index) { return values_.data() + element_offset(index, num_cols_); }
  const float* row(int64_t index) const { return values_.data() + element_offset(index, num_cols_); }

 private:
  int64_t num_rows_ = 0;
  int64_t num_cols_ = 0;
  std::vector<float, UninitializedAllocator<float>> values_;  // [num_rows, num_cols]
};

}  // namespace jambo::backend::cpu
