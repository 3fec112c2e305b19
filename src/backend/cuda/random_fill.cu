#include "backend/cuda/random_fill.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_math.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 16;  // a grid-stride loop covers the rest

// One element as stored: fp32 as is, bf16 and IEEE half as their bits, rounded to nearest even (as the host's
// to_bf16 and to_f16 round).
template <DType kType>
__device__ auto stored(float value);
template <>
__device__ auto stored<DType::F32>(float value) {
  return value;
}
template <>
__device__ auto stored<DType::BF16>(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}
template <>
__device__ auto stored<DType::F16>(float value) {
  return __half_as_ushort(__float2half_rn(value));
}

template <DType kType, typename Bits>
__global__ void fill_random_kernel(model::RandomTensor tensor, Bits* out) {  // out: [tensor.numel]
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tensor.numel; i += stride)
    out[i] = stored<kType>(tensor.init.arithmetic_value(tensor.stream, tensor.map.source(i)));
}

}  // namespace

void fill_random(const model::RandomTensor& tensor, void* out, cudaStream_t stream) {
  require(tensor.init.is_arithmetic(), "fill_random: log and exp initializers are filled on the host");
  if (tensor.numel == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>(num_blocks_for(tensor.numel, kThreads), kMaxBlocks));
  switch (tensor.dtype) {
    case DType::F32:
      fill_random_kernel<DType::F32>
          <<<blocks, kThreads, 0, stream>>>(tensor, static_cast<float*>(out));
      break;
    case DType::BF16:
      fill_random_kernel<DType::BF16>
          <<<blocks, kThreads, 0, stream>>>(tensor, static_cast<uint16_t*>(out));
      break;
    case DType::F16:
      fill_random_kernel<DType::F16>
          <<<blocks, kThreads, 0, stream>>>(tensor, static_cast<uint16_t*>(out));
      break;
  }
  JAMBO_CUDA_CHECK_LAUNCH(fill_random_kernel);
}

}  // namespace jambo::backend::cuda
