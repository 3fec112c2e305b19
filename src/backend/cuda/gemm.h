// Dense GEMMs through cuBLAS: y = x · wᵀ with w in nn.Linear layout, all row-major.
#pragma once

#include "backend/cuda/device_weights.h"

#include <cublas_v2.h>

namespace jambo::cuda {

// Creates the cuBLAS handle bound to `stream`, with TF32 and other reduced-precision shortcuts off
// (the f32 mode must agree with the CPU backend to 1e-4 on logprobs).
cublasHandle_t make_cublas(cudaStream_t stream);

// y[m, n] = sum_k x[m, k] * w[n, k] for m < num_rows.
void linear(cublasHandle_t cublas,
            const float* x,  // [num_rows, w.cols]
            int64_t num_rows,
            const DeviceMatrix& w,  // [N, K]
            float* y);              // [num_rows, w.rows]

// The same where consecutive rows of x lie x_stride floats apart (a column slice of a wider matrix).
void linear_strided(cublasHandle_t cublas,
                    const float* x,  // [num_rows, x_stride], the first w.cols columns read
                    int64_t x_stride, int64_t num_rows,
                    const DeviceMatrix& w,  // [N, K]
                    float* y);              // [num_rows, w.rows]

}  // namespace jambo::cuda
