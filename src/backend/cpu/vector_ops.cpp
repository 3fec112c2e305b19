#include "backend/cpu/vector_ops.h"

#include "core/error.h"

namespace jambo::backend::cpu {

void rms_norm(const float* x, const TensorView& weight, float eps, float* out) {
  const int64_t n = weight.numel();
  float sum_of_squares = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_of_squares += x[i] * x[i];
  const float inverse_rms = 1.0f / std::sqrt(sum_of_squares / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight.at(i) * (x[i] * inverse_rms);
}

void rms_norm_rows(const Matrix& x, const TensorView& weight, float eps, Matrix& out) {
  JAMBO_REQUIRE(x.num_cols() == weight.numel(), "rms_norm: input has {} columns but '{}' has {} values",
                x.num_cols(), weight.name, weight.numel());
  out.resize(x.num_rows(), x.num_cols());
  parallel_for(x.num_rows(), x.num_cols(), [&](int64_t t) { rms_norm(x.row(t), weight, eps, out.row(t)); });
}

void add_bias(Matrix& y, const TensorView& bias) {
  if (bias.empty()) return;
  JAMBO_REQUIRE(bias.numel() == y.num_cols(), "bias '{}' has {} values for {} columns", bias.name, bias.numel(),
                y.num_cols());
  parallel_for(y.num_rows(), y.num_cols(), [&](int64_t t) {
    float* row = y.row(t);
    for (int64_t i = 0; i < y.num_cols(); ++i) row[i] += bias.at(i);
  });
}

void add_in_place(Matrix& y, const Matrix& x) {
  JAMBO_ASSERT(y.num_rows() == x.num_rows() && y.num_cols() == x.num_cols());
  const int64_t num_cols = y.num_cols();
  parallel_for(y.num_rows(), num_cols, [&](int64_t t) {
    float* out = y.row(t);
    const float* in = x.row(t);
    for (int64_t i = 0; i < num_cols; ++i) out[i] += in[i];
  });
}

}  // namespace jambo::backend::cpu
