#include "backend/cuda/convert.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/device_memory.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cuda_fp16.h>

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;

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

// One element per thread: at decode the input is a few KB per row, far below the weights the GEMM reads.
__global__ void narrow_kernel(const float* x,  // [rows, x_stride]
                              int64_t x_stride, int64_t rows, int64_t cols,
                              Narrow16 out) {  // [rows, cols]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(rows, cols)) return;
  const int64_t r = i / cols, c = i % cols;
  store_narrow(out, i, x[device_offset(r, x_stride) + c]);
}

__global__ void negative_exp_kernel(const float* in,  // [count]
                                    int64_t count,
                                    float* out) {  // [count]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = -expf(in[i]);
}

// Counts the values with |x| >= limit, and with count_nan the NaNs too.
__global__ void count_beyond_kernel(const float* x,  // [count]
                                    int64_t count, float limit, bool count_nan,
                                    unsigned long long* counter) {  // [1]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && (fabsf(x[i]) >= limit || (count_nan && isnan(x[i])))) atomicAdd(counter, 1ull);
}

int64_t count_beyond(const float* x, int64_t count, float limit, bool count_nan, cudaStream_t stream) {
  if (count == 0) return 0;
  DeviceBuffer<unsigned long long> counter(1);
  JAMBO_CUDA_CHECK(cudaMemsetAsync(counter.data(), 0, sizeof(unsigned long long), stream));
  count_beyond_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(x, count, limit, count_nan,
                                                                                counter.data());
  JAMBO_CUDA_CHECK_LAUNCH(count_beyond_kernel);
  unsigned long long host = 0;
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(&host, counter.data(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
  return int64_t(host);
}

}  // namespace

int64_t count_beyond_f16(const float* x, int64_t count, cudaStream_t stream) {
  constexpr float kRoundsToInfinity = 65520.0f;  // half's largest finite value 65504 plus half its last step
  return count_beyond(x, count, kRoundsToInfinity, /*count_nan=*/false, stream);
}

int64_t count_nonfinite(const float* x, int64_t count, cudaStream_t stream) {
  return count_beyond(x, count, INFINITY, /*count_nan=*/true, stream);
}

void widen_to_f32(const uint16_t* in, bool is_bf16, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  widen_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(in, is_bf16, count, out);
  JAMBO_CUDA_CHECK_LAUNCH(widen_kernel);
}

void narrow_to_16(const float* x, int64_t x_stride, int64_t rows, int64_t cols, bool to_bf16, uint16_t* out,
                  cudaStream_t stream) {
  const int64_t count = device_offset(rows, cols);
  if (count == 0) return;
  const Narrow16 narrow{out, to_bf16 ? DType::BF16 : DType::F16};
  narrow_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(x, x_stride, rows, cols, narrow);
  JAMBO_CUDA_CHECK_LAUNCH(narrow_kernel);
}

void negative_exp_f32(const float* in, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  negative_exp_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(in, count, out);
  JAMBO_CUDA_CHECK_LAUNCH(negative_exp_kernel);
}

}  // namespace jambo::backend::cuda
