// Element-wise conversions: 16-bit weights widened to fp32 at load (and narrowed to f16 in the f16 mode), A =
// -exp(A_log), and GEMM inputs rounded to 16 bits (bf16 and f16 modes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace jambo::backend::cuda {

// out[i] = float(in[i]) where in holds bf16 (is_bf16) or IEEE half bit patterns.
void widen_to_f32(const uint16_t* in,  // [count]
                  bool is_bf16, int64_t count,
                  float* out,  // [count]
                  cudaStream_t stream);

// out[r, c] = x[r, c] rounded to nearest even in bf16 (to_bf16) or IEEE half, for c < cols.
void narrow_to_16(const float* x,  // [rows, x_stride], the first cols columns read
                  int64_t x_stride, int64_t rows, int64_t cols, bool to_bf16,
                  uint16_t* out,  // [rows, cols]
                  cudaStream_t stream);

// How many of x's values round to an infinite IEEE half (|x| >= 65520; NaN is not counted). Waits for the result.
int64_t count_beyond_f16(const float* x,  // [count]
                         int64_t count, cudaStream_t stream);
// How many of x's values are NaN or infinite. Waits for the result.
int64_t count_nonfinite(const float* x,  // [count]
                        int64_t count, cudaStream_t stream);

// out[i] = -exp(in[i]); out may be in.
void negative_exp_f32(const float* in,  // [count]
                      int64_t count,
                      float* out,  // [count]
                      cudaStream_t stream);

}  // namespace jambo::backend::cuda
