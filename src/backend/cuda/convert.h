// Element-wise conversions of weights at load: 16-bit floats widened to fp32, A = -exp(A_log).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace jambo::cuda {

// out[i] = float(in[i]) where in holds bf16 (is_bf16) or IEEE half bit patterns.
void widen_to_f32(const uint16_t* in,  // [count]
                  bool is_bf16, int64_t count,
                  float* out,  // [count]
                  cudaStream_t stream);

// out[i] = -exp(in[i]).
void negative_exp_f32(const float* in,  // [count]
                      int64_t count,
                      float* out,  // [count]
                      cudaStream_t stream);

}  // namespace jambo::cuda
