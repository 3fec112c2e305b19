#include "backend/cuda/attention.h"
#include "backend/cuda/device_math.cuh"

namespace jambo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kKeysPerTile = 32;  // one warp lane per key in the softmax

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

// Shared memory of one attention block, in floats: the group's queries and outputs [G, hd], a tile of keys
// or values [kKeysPerTile, hd + 1] (padded so that a warp reading one entry of 32 keys hits 32 banks),
// the tile's weights [G, kKeysPerTile] and each head's running max, sum and rescale factor [G] each.
struct AttentionShared {
  int64_t group_size, head_dim;
  JAMBO_HOST_DEVICE int64_t tile_stride() const { return head_dim + 1; }
  JAMBO_HOST_DEVICE int64_t queries() const { return 0; }
  JAMBO_HOST_DEVICE int64_t outputs() const { return group_size * head_dim; }
  JAMBO_HOST_DEVICE int64_t tile() const { return 2 * group_size * head_dim; }
  JAMBO_HOST_DEVICE int64_t weights() const { return tile() + kKeysPerTile * tile_stride(); }
  JAMBO_HOST_DEVICE int64_t stats() const { return weights() + group_size * kKeysPerTile; }
  JAMBO_HOST_DEVICE int64_t num_floats() const { return stats() + 3 * group_size; }
};

// tile[k, d] = the keys (key_or_value 0) or values (1) of KV head kv_head at positions first + k: a warp per
// key, its lanes along the head dimension (one block-table lookup per key, coalesced reads).
__device__ void load_tile(const DeviceRows& rows, const KvLayout& layout, int64_t r, int64_t first, int count,
                          int key_or_value, int64_t kv_head, const float* kv_pool, float* tile) {
  const int head_dim = int(layout.head_dim);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, num_warps = blockDim.x / kWarpSize;
  for (int k = warp; k < count; k += num_warps) {
    const float* entry = kv_pool + kv_entry(rows, layout, r, first + k, key_or_value) + device_offset(kv_head, head_dim);
    for (int e = lane; e < head_dim; e += kWarpSize) tile[k * (head_dim + 1) + e] = entry[e];
  }
}

// One block per (token, KV head) for the G = nh / nkv query heads that share it, so each key and value is read
// once for all of them. Keys are taken a tile at a time with the online softmax: per head a running max m,
// running sum l and the unnormalized outputs, rescaled when m grows.
__global__ void attention_kernel(DeviceRows rows, KvLayout layout, int64_t num_heads,
                                 const float* queries,  // [T, nh*hd]
                                 const float* kv_pool,  // [num_blocks, block_stride]
                                 float* context) {      // [T, nh*hd]
  extern __shared__ float shared[];
  const int64_t head_dim = layout.head_dim, group_size = num_heads / layout.num_kv_heads;
  const AttentionShared at{group_size, head_dim};
  float* query = shared + at.queries();  // [G, hd]
  float* acc = shared + at.outputs();    // [G, hd]
  float* tile = shared + at.tile();      // [kKeysPerTile, hd + 1]
  float* weights = shared + at.weights();  // [G, kKeysPerTile]
  float* running_max = shared + at.stats(), *running_sum = running_max + group_size, *rescale = running_sum + group_size;
  const int64_t t = blockIdx.x / layout.num_kv_heads, kv_head = blockIdx.x % layout.num_kv_heads;
  const int64_t r = rows.token_row[t];
  const int64_t num_keys = rows.start_position[r] + t - rows.first_token[r] + 1;
  const float scale = 1.0f / sqrtf(float(head_dim));
  const int64_t group_width = group_size * head_dim;  // the group's query heads are contiguous
  const float* q_in = queries + device_offset(t, num_heads * head_dim) + device_offset(kv_head, group_width);
  for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) {
    query[i] = q_in[i];
    acc[i] = 0.0f;
  }
  for (int64_t h = threadIdx.x; h < group_size; h += blockDim.x) {
    running_max[h] = -INFINITY;
    running_sum[h] = 0.0f;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, num_warps = blockDim.x / kWarpSize;
  for (int64_t first = 0; first < num_keys; first += kKeysPerTile) {
    const int count = int(min(int64_t(kKeysPerTile), num_keys - first));
    load_tile(rows, layout, r, first, count, 0, kv_head, kv_pool, tile);
    __syncthreads();
    for (int i = threadIdx.x; i < int(group_size) * count; i += blockDim.x) {
      const int h = i / count, k = i % count;
      float dot = 0.0f;
      for (int e = 0; e < int(head_dim); ++e) dot += query[h * head_dim + e] * tile[k * (head_dim + 1) + e];
      weights[h * kKeysPerTile + k] = dot * scale;
    }
    __syncthreads();
    for (int64_t h = warp; h < group_size; h += num_warps) {  // a warp per head: one lane per key of the tile
      float* w = weights + h * kKeysPerTile;
      const float score = lane < count ? w[lane] : -INFINITY;
      const float new_max = fmaxf(running_max[h], warp_max(score));
      const float weight = lane < count ? expf(score - new_max) : 0.0f;
      if (lane < count) w[lane] = weight;
      const float tile_sum = warp_sum(weight);
      if (lane == 0) {
        rescale[h] = expf(running_max[h] - new_max);  // 0 on the first tile
        running_sum[h] = running_sum[h] * rescale[h] + tile_sum;
        running_max[h] = new_max;
      }
    }
    load_tile(rows, layout, r, first, count, 1, kv_head, kv_pool, tile);  // the keys are no longer read
    __syncthreads();
    for (int i = threadIdx.x; i < int(group_width); i += blockDim.x) {
      const int h = i / int(head_dim), e = i % int(head_dim);
      float sum = 0.0f;
      for (int k = 0; k < count; ++k) sum += weights[h * kKeysPerTile + k] * tile[k * (head_dim + 1) + e];
      acc[i] = acc[i] * rescale[h] + sum;
    }
    __syncthreads();  // the tile and weights are rewritten by the next tile
  }
  float* out = context + device_offset(t, num_heads * head_dim) + device_offset(kv_head, group_width);
  for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) out[i] = acc[i] / running_sum[i / head_dim];
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
  const int64_t num_blocks = device_offset(rows.num_tokens, layout.num_kv_heads);
  if (num_blocks == 0) return;
  require(num_blocks < (int64_t(1) << 31),
          "attention over " + std::to_string(num_blocks) + " (token, KV head) pairs is too many for one launch");
  const AttentionShared at{num_heads / layout.num_kv_heads, layout.head_dim};
  const size_t shared_bytes = size_t(at.num_floats()) * sizeof(float);
  int device = 0, max_shared = 0;
  JAMBO_CUDA_CHECK(cudaGetDevice(&device));
  JAMBO_CUDA_CHECK(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  require(shared_bytes <= size_t(max_shared),
          "attention with " + std::to_string(at.group_size) + " query heads per KV head of dimension " +
              std::to_string(layout.head_dim) + " needs " + std::to_string(shared_bytes) +
              " bytes of shared memory per block; this GPU allows " + std::to_string(max_shared));
  JAMBO_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  attention_kernel<<<unsigned(num_blocks), kThreads, shared_bytes, stream>>>(rows, layout, num_heads, queries, kv_pool,
                                                                            context);
  JAMBO_CUDA_CHECK_LAUNCH(attention_kernel);
}

}  // namespace jambo::cuda
