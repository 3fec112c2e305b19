// Random weight tensors of any dtype owned by a test, for testing the ops without a model.
#pragma once

#include "backend/cpu/matrix.h"
#include "core/tensor.h"

#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace jambo::testing {

class TensorStore {
 public:
  explicit TensorStore(uint64_t seed) : random_(seed) {}

  // Values uniform in [center - spread, center + spread], rounded to the dtype.
  TensorView make(std::vector<int64_t> shape, DType dtype, float spread, float center = 0.0f) {
    TensorView view;
    view.shape = std::move(shape);
    view.dtype = dtype;
    view.name = "test tensor " + std::to_string(buffers_.size());
    const int64_t numel = view.numel();
    buffers_.push_back(std::make_unique<std::byte[]>(size_t(numel * dtype_size(dtype))));
    std::byte* data = buffers_.back().get();
    std::uniform_real_distribution<float> uniform(center - spread, center + spread);
    for (int64_t i = 0; i < numel; ++i) store(uniform(random_), dtype, data + i * dtype_size(dtype));
    view.data = data;
    return view;
  }

  backend::cpu::Matrix matrix(int64_t num_rows, int64_t num_cols, float spread) {
    backend::cpu::Matrix out(num_rows, num_cols);
    std::uniform_real_distribution<float> uniform(-spread, spread);
    for (int64_t i = 0; i < num_rows * num_cols; ++i) out.data()[i] = uniform(random_);
    return out;
  }

 private:
  static void store(float value, DType dtype, std::byte* out) {
    switch (dtype) {
      case DType::F32: std::memcpy(out, &value, 4); return;
      case DType::BF16: {
        const bf16 rounded = to_bf16(value);
        std::memcpy(out, &rounded, 2);
        return;
      }
      case DType::F16: {
        const f16 rounded = to_f16(value);
        std::memcpy(out, &rounded, 2);
        return;
      }
    }
  }

  std::mt19937_64 random_;
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
};

// Element (row, col) of a 2-D view as a double.
inline double weight_at(const TensorView& view, int64_t row, int64_t col) {
  return view.at(row * view.cols() + col);
}

inline bool bitwise_equal(const float* a, const float* b, int64_t count) {
  return std::memcmp(a, b, size_t(count) * sizeof(float)) == 0;
}

}  // namespace jambo::testing
