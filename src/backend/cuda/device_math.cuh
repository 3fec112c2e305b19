// Device helpers shared by the kernels: the activations (as the CPU backend computes them) and
// block-wide reductions. Included by .cu files only.
#pragma once

#include "backend/cuda/narrow16.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace jambo::cuda {

constexpr int kWarpSize = 32;

__device__ inline float silu(float a) { return a / (1.0f + expf(-a)); }

// PyTorch's softplus with beta 1 and threshold 20, as vector_ops.h.
__device__ inline float softplus(float a) { return a > 20.0f ? a : log1pf(expf(a)); }

__device__ inline float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ inline float warp_max(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// The sum (or max) over all threads of the block, returned to every thread. blockDim.x is a multiple of
// 32 and at most 1024; `scratch` holds 32 floats of shared memory, free again when this returns.
template <bool kMax>
__device__ inline float block_reduce(float value, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  value = kMax ? warp_max(value) : warp_sum(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  float total = lane < num_warps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
  total = kMax ? warp_max(total) : warp_sum(total);
  __syncthreads();  // scratch may be reused by the caller's next reduction
  return total;
}

__device__ inline float block_sum(float value, float* scratch) { return block_reduce<false>(value, scratch); }
__device__ inline float block_max(float value, float* scratch) { return block_reduce<true>(value, scratch); }

// value rounded to nearest even in the copy's 16-bit type, stored at index i.
__device__ inline void store_narrow(const Narrow16& copy, int64_t i, float value) {
  copy.data[i] = copy.dtype == DType::BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(value))
                                           : __half_as_ushort(__float2half_rn(value));
}

inline unsigned num_blocks_for(int64_t count, int threads) { return unsigned((count + threads - 1) / threads); }

}  // namespace jambo::cuda
