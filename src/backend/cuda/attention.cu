#include "backend/cuda/attention.h"
#include "backend/cuda/device_math.cuh"

namespace jambo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kKeysPerTile = 128;  // the attention block's threads, one key each per tile

// Element offset of a position's [nkv, hd] keys (key_or_value 0) or values (1) in the pool.
__device__ inline int64_t kv_entry(const DeviceRows& rows, const KvLayout& layout, int64_t row, int64_t position,
                                   int key_or_value) {
  const int64_t block = rows.block_tables[rows.block_table_offset[row] + position / layout.block_size];
  return device_offset(block, layout.block_stride) + layout.layer_offset +
         device_offset(key_or_value, layout.half_stride()) +
         device_offset(position % layout.block_size, layout.token_stride());
}

__global__ void store_kernel(DeviceRows rows, KvLayout layout,
                             const float* keys,    // [T, nkv*hd]
                             const float* values,  // [T, nkv*hd]
                             float* kv_pool) {     // [num_blocks, block_stride]
  const int64_t width = layout.token_stride();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(rows.num_tokens, width)) return;
  const int64_t t = i / width, e = i % width;
  const int64_t r = rows.token_row[t];
  const int64_t position = rows.start_position[r] + t - rows.first_token[r];
  kv_pool[kv_entry(rows, layout, r, position, 0) + e] = keys[i];
  kv_pool[kv_entry(rows, layout, r, position, 1) + e] = values[i];
}

// One block of kKeysPerTile threads per (token, query head). Keys are taken a tile at a time with the online
// softmax: running max m, running sum l and the unnormalized output acc, rescaled when m grows.
// Shared memory: the query [hd], acc [hd] and the tile's weights [kKeysPerTile].
__global__ void attention_kernel(DeviceRows rows, KvLayout layout, int64_t num_heads,
                                 const float* queries,  // [T, nh*hd]
                                 const float* kv_pool,  // [num_blocks, block_stride]
                                 float* context) {      // [T, nh*hd]
  extern __shared__ float shared[];
  __shared__ float scratch[kWarpSize];
  const int64_t head_dim = layout.head_dim;
  float* query = shared;            // [hd]
  float* acc = shared + head_dim;   // [hd]
  float* weights = acc + head_dim;  // [kKeysPerTile]
  const int64_t t = blockIdx.x / num_heads, head = blockIdx.x % num_heads;
  const int64_t r = rows.token_row[t];
  const int64_t num_keys = rows.start_position[r] + t - rows.first_token[r] + 1;
  const int64_t kv_head_offset = device_offset(head / (num_heads / layout.num_kv_heads), head_dim);
  const float scale = 1.0f / sqrtf(float(head_dim));
  const float* q_in = queries + device_offset(t, num_heads * head_dim) + device_offset(head, head_dim);
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    query[d] = q_in[d];
    acc[d] = 0.0f;
  }
  __syncthreads();
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t tile = 0; tile < num_keys; tile += kKeysPerTile) {
    const int64_t j = tile + threadIdx.x;
    float score = -INFINITY;
    if (j < num_keys) {
      const float* key = kv_pool + kv_entry(rows, layout, r, j, 0) + kv_head_offset;
      float dot = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) dot += query[d] * key[d];
      score = dot * scale;
    }
    const float new_max = fmaxf(running_max, block_max(score, scratch));
    const float correction = expf(running_max - new_max);  // 0 on the first tile
    const float weight = j < num_keys ? expf(score - new_max) : 0.0f;
    weights[threadIdx.x] = weight;
    running_sum = running_sum * correction + block_sum(weight, scratch);  // block_sum syncs: weights are visible
    const int64_t tile_keys = min(int64_t(kKeysPerTile), num_keys - tile);
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float sum = 0.0f;
      for (int64_t k = 0; k < tile_keys; ++k)
        sum += weights[k] * kv_pool[kv_entry(rows, layout, r, tile + k, 1) + kv_head_offset + d];
      acc[d] = acc[d] * correction + sum;
    }
    running_max = new_max;
    __syncthreads();  // weights is rewritten by the next tile
  }
  float* out = context + device_offset(t, num_heads * head_dim) + device_offset(head, head_dim);
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) out[d] = acc[d] / running_sum;
}

}  // namespace

void store_keys_and_values(const DeviceRows& rows, const KvLayout& layout, const float* keys, const float* values,
                           float* kv_pool, cudaStream_t stream) {
  const int64_t count = device_offset(rows.num_tokens, layout.token_stride());
  if (count == 0) return;
  store_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(rows, layout, keys, values, kv_pool);
  JAMBO_CUDA_CHECK_LAUNCH(store_kernel);
}

void paged_attention(const DeviceRows& rows, const KvLayout& layout, int64_t num_heads, const float* queries,
                     const float* kv_pool, float* context, cudaStream_t stream) {
  const int64_t num_blocks = device_offset(rows.num_tokens, num_heads);
  if (num_blocks == 0) return;
  require(num_blocks < (int64_t(1) << 31),
          "attention over " + std::to_string(num_blocks) + " (token, head) pairs is too many for one launch");
  const size_t shared_bytes = size_t(2 * layout.head_dim + kKeysPerTile) * sizeof(float);
  attention_kernel<<<unsigned(num_blocks), kKeysPerTile, shared_bytes, stream>>>(rows, layout, num_heads, queries,
                                                                                 kv_pool, context);
  JAMBO_CUDA_CHECK_LAUNCH(attention_kernel);
}

}  // namespace jambo::cuda
