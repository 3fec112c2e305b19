#include "backend/cuda/device_communicator.h"

#include "backend/cuda/cuda_check.h"

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 14;  // a grid-stride loop covers the rest

__global__ void sum_in_rank_order_kernel(RankParts parts, float* sum, int64_t count) {  // sum [count]
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float total = parts.parts[0][i];
    for (int64_t r = 1; r < parts.num_parts; ++r) total += parts.parts[r][i];
    sum[i] = total;
  }
}

}  // namespace

void sum_in_rank_order(const RankParts& parts, float* sum, int64_t count, cudaStream_t stream) {
  require(parts.num_parts >= 1 && parts.num_parts <= kMaxRanks, "sum_in_rank_order: 1 to 16 ranks");
  if (count == 0) return;
  const int64_t blocks = std::min((count + kThreads - 1) / kThreads, kMaxBlocks);
  sum_in_rank_order_kernel<<<int(blocks), kThreads, 0, stream>>>(parts, sum, count);
  JAMBO_CUDA_CHECK_LAUNCH(sum_in_rank_order_kernel);
}

}  // namespace jambo::backend::cuda
