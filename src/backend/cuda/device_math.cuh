// Device helpers shared by the kernels: the activations (as the CPU backend computes them) and
// block-wide reductions. Included by .cu files only.
// nvcc contracts a * b + c into one FMA where it sees fit, and may see fit differently in two kernels inlining the
// same expression. Arithmetic that two paths must share bit for bit is therefore written with the rounding
// intrinsics (__fmaf_rn, __fmul_rn, __fadd_rn, never contracted) in one device function both call.
#pragma once

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/narrow16.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <utility>

namespace jambo::backend::cuda {

constexpr int kWarpSize = 32;

__device__ inline float silu(float a) { return a / (1.0f + expf(-a)); }

// silu(gate) * up: the SwiGLU kernel's and the GEMM's fused SwiGLU epilogue (skinny_gemm.cu).
__device__ inline float swiglu_value(float gate, float up) { return __fmul_rn(silu(gate), up); }

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

// The sum over all threads of the block, returned to every thread. blockDim.x is a multiple of 32 and at most
// 1024; `scratch` holds 32 floats of shared memory, free again when this returns.
__device__ inline float block_sum(float value, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  value = warp_sum(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  const float total = warp_sum(lane < num_warps ? scratch[lane] : 0.0f);
  __syncthreads();  // scratch may be reused by the caller's next reduction
  return total;
}

// value rounded to nearest even in the copy's 16-bit type.
__device__ inline uint16_t narrow_bits(const Narrow16& copy, float value) {
  return copy.dtype == DType::BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(value))
                                   : __half_as_ushort(__float2half_rn(value));
}

// value rounded, stored at index i.
__device__ inline void store_narrow(const Narrow16& copy, int64_t i, float value) {
  copy.data[i] = narrow_bits(copy, value);
}

// Four values rounded, stored at i .. i + 3 in one 8-byte store: i must be a multiple of 4.
__device__ inline void store_narrow4(const Narrow16& copy, int64_t i, const float (&values)[4]) {
  const uint2 packed{narrow_bits(copy, values[0]) | uint32_t(narrow_bits(copy, values[1])) << 16,
                     narrow_bits(copy, values[2]) | uint32_t(narrow_bits(copy, values[3])) << 16};
  *reinterpret_cast<uint2*>(copy.data + i) = packed;
}

// Programmatic dependent launch (Hopper and later), for the chains of small kernels of a decode step: a kernel
// started with launch_early may be scheduled before the kernel ahead of it in the stream has finished, once every
// block of that kernel has called let_next_kernel_start() or exited, so that its launch and ramp overlap that
// kernel's tail. As every kernel calls let_next_kernel_start() on entry, several can be in flight at once: code before
// wait_for_previous_kernel() runs beside any earlier kernel of the step. So before its wait a kernel reads only what
// no kernel of the step writes (weights, the uploaded rows, and the layer's conv tails in the skinny GEMM's fused conv
// or its states in the one-token update, each the only writer of them in a step), writes nothing, and never reads
// through the read-only path (tests/backend/cuda/source_rules.sh). wait_for_previous_kernel() returns when the kernel ahead
// has finished and its writes are visible. Some blocks of every early kernel wait, so that its end implies its
// predecessor's. let_next_kernel_start() does nothing when the next kernel was launched the usual way.
__device__ inline void let_next_kernel_start() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ inline void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to start early (above).
template <typename... Params, typename... Args>
void launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                  Args&&... args) {
  cudaLaunchAttribute early{};
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &early;
  config.numAttrs = 1;
  JAMBO_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

inline unsigned num_blocks_for(int64_t count, int threads) { return unsigned((count + threads - 1) / threads); }

}  // namespace jambo::backend::cuda
