#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jambo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kWeightsPerLoad = 8;  // 16-bit weights in one 16-byte load

template <bool kBf16>
__device__ inline float widened(uint16_t bits) {
  if constexpr (kBf16)
    return __bfloat162float(__ushort_as_bfloat16(bits));
  else
    return __half2float(__ushort_as_half(bits));
}

// One warp per output feature n: its lanes stream w[n, :] in 16-byte loads and dot it with every row of x.
template <bool kBf16>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const uint16_t* x,  // [num_rows, K] in w's type
                                                        int num_rows,
                                                        const uint16_t* w,  // [N, K]
                                                        int64_t n_out, int64_t k_in,
                                                        float* y) {  // [num_rows, N]
  const int64_t n = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (n >= n_out) return;
  float sums[kMaxGemvRows] = {};
  const uint16_t* w_row = w + device_offset(n, k_in);
  for (int64_t k = int64_t(lane) * kWeightsPerLoad; k < k_in; k += kWarpSize * kWeightsPerLoad) {
    const uint4 packed = *reinterpret_cast<const uint4*>(w_row + k);
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(&packed);
    float weights[kWeightsPerLoad];
#pragma unroll
    for (int j = 0; j < kWeightsPerLoad; ++j) weights[j] = widened<kBf16>(bits[j]);
#pragma unroll
    for (int m = 0; m < kMaxGemvRows; ++m) {
      if (m >= num_rows) break;
      const uint4 x_packed = *reinterpret_cast<const uint4*>(x + device_offset(m, k_in) + k);
      const uint16_t* x_bits = reinterpret_cast<const uint16_t*>(&x_packed);
#pragma unroll
      for (int j = 0; j < kWeightsPerLoad; ++j) sums[m] += widened<kBf16>(x_bits[j]) * weights[j];
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxGemvRows; ++m) {
    if (m >= num_rows) break;
    const float total = warp_sum(sums[m]);
    if (lane == 0) y[device_offset(m, n_out) + n] = total;
  }
}

}  // namespace

bool gemv_applies(int64_t num_rows, const DeviceMatrix& w) {
  return w.dtype != DType::F32 && num_rows <= kMaxGemvRows && w.cols % kWeightsPerLoad == 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

void gemv_16(const uint16_t* x, int64_t num_rows, const DeviceMatrix& w, float* y, cudaStream_t stream) {
  require(gemv_applies(num_rows, w) && reinterpret_cast<uintptr_t>(x) % 16 == 0,
          "gemv_16 called outside gemv_applies (please report this)");
  const unsigned num_blocks = unsigned((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto* weights = static_cast<const uint16_t*>(w.data);
  if (w.dtype == DType::BF16)
    gemv_kernel<true><<<num_blocks, kThreads, 0, stream>>>(x, int(num_rows), weights, w.rows, w.cols, y);
  else
    gemv_kernel<false><<<num_blocks, kThreads, 0, stream>>>(x, int(num_rows), weights, w.rows, w.cols, y);
  JAMBO_CUDA_CHECK_LAUNCH(gemv_kernel);
}

}  // namespace jambo::cuda
