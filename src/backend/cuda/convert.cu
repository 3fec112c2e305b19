#include "backend/cuda/convert.h"
#include "backend/cuda/cuda_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jambo::cuda {
namespace {

constexpr int kThreads = 256;

int64_t num_blocks_for(int64_t count) { return (count + kThreads - 1) / kThreads; }

// out[i] = float(in[i]) for 16-bit inputs (bf16 or IEEE half).
__global__ void widen_kernel(const uint16_t* in,  // [count]
                             bool is_bf16, int64_t count,
                             float* out) {  // [count]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  if (is_bf16) {
    out[i] = __uint_as_float(uint32_t(in[i]) << 16);
  } else {
    out[i] = __half2float(__ushort_as_half(in[i]));
  }
}

__global__ void negative_exp_kernel(const float* in,  // [count]
                                    int64_t count,
                                    float* out) {  // [count]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = -expf(in[i]);
}

}  // namespace

void widen_to_f32(const uint16_t* in, bool is_bf16, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  widen_kernel<<<num_blocks_for(count), kThreads, 0, stream>>>(in, is_bf16, count, out);
  JAMBO_CUDA_CHECK_LAUNCH(widen_kernel);
}

void negative_exp_f32(const float* in, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  negative_exp_kernel<<<num_blocks_for(count), kThreads, 0, stream>>>(in, count, out);
  JAMBO_CUDA_CHECK_LAUNCH(negative_exp_kernel);
}

}  // namespace jambo::cuda
