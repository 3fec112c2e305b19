// The one GEMM of the CPU backend: y = x · wᵀ with w in its stored dtype (nn.Linear layout).
//
// Batch invariance (DESIGN.md law 5) lives here: every y[m, n] is summed in one fixed order that
// depends only on K (16 lane accumulators over k, then a fixed pairwise tree), never on M, on the
// blocking or on the thread count. So a token's outputs are bitwise the same whatever other rows
// share the call.
#pragma once

#include "backend/cpu/matrix.h"
#include "core/tensor.h"

namespace jambo::backend::cpu {

// y[m, n] = sum_k x[m, k] * weight[n, k]; y is resized to [M, N].
void matmul(const Matrix& x,             // [M, K]
            const TensorView& weight,    // [N, K]
            Matrix& y);                  // [M, N]

// Same, on raw rows: x [num_rows, K] contiguous, y [num_rows, N] contiguous.
void matmul(const float* x, int64_t num_rows, const TensorView& weight, float* y);

}  // namespace jambo::backend::cpu
