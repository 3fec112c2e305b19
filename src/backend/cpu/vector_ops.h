// Small fp32 element-wise and per-row operations of the forward (spec §3.3, §3.5).
#pragma once

#include "backend/cpu/matrix.h"
#include "core/tensor.h"

#include <cmath>

namespace jambo::backend::cpu {

inline float silu(float a) { return a / (1.0f + std::exp(-a)); }

// PyTorch's softplus with beta 1 and threshold 20.
inline float softplus(float a) { return a > 20.0f ? a : std::log1p(std::exp(a)); }

// Runs body(i) for every i in [0, count), on all threads once count * cost_per_item is worth a
// fork. Each i is computed by the same code on any thread, so the results do not change.
template <typename Body>
void parallel_for(int64_t count, int64_t cost_per_item, Body body) {
  constexpr int64_t kMinParallelCost = 1 << 14;  // below this, the fork costs more than it saves
#pragma omp parallel for schedule(static) if (count * cost_per_item >= kMinParallelCost)
  for (int64_t i = 0; i < count; ++i) body(i);
}

// out = weight * (x / sqrt(mean(x^2) + eps)), summed in index order.
void rms_norm(const float* x,             // [n]
              const TensorView& weight,   // [n]
              float eps,
              float* out);                // [n]; may alias x

// rms_norm over every row of x.
void rms_norm_rows(const Matrix& x,            // [T, n]
                   const TensorView& weight,   // [n]
                   float eps,
                   Matrix& out);               // [T, n]

// y[t, :] += bias; nothing when the bias is absent (empty view).
void add_bias(Matrix& y,                  // [T, n]
              const TensorView& bias);    // [n] or empty

// y += x, element-wise (the residual additions).
void add_in_place(Matrix& y,              // [T, n]
                  const Matrix& x);       // [T, n]

}  // namespace jambo::backend::cpu
