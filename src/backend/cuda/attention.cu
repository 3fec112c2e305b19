#include "backend/cuda/attention.h"
#include "backend/cuda/device_math.cuh"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>

namespace jambo::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kKeysPerTile = 32;  // one warp lane per key in the softmax
// A step of few tokens splits each token's keys among blocks, up to kMaxSplits, until there are about
// kBlocksPerSmWanted blocks per SM: one block walking a long context alone leaves the GPU idle (batch 1).
constexpr int kBlocksPerSmWanted = 4;
constexpr int kMaxSplits = 32;
constexpr int kCombineThreads = 128;

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

// One block per (token, KV head, split of the token's keys) for the G = nh / nkv query heads that share the KV
// head, so each key and value is read once for all of them. A split takes its keys a tile at a time with the
// online softmax: per head a running max m, running sum l and the unnormalized outputs, rescaled when m grows.
// With one split the block writes the context; with more, its (m, l, outputs) go to `partial` and
// combine_splits_kernel merges them.
__global__ void attention_kernel(DeviceRows rows, KvLayout layout, int64_t num_heads, int num_splits,
                                 bool skip_chunked_rows,  // rows of several tokens are attention_mma_kernel's
                                 const float* queries,  // [T, nh*hd]
                                 const float* kv_pool,  // [num_blocks, block_stride]
                                 float* context,        // [T, nh*hd] (one split)
                                 float* partial) {      // [T, nh, num_splits, hd + 2] (several)
  extern __shared__ float shared[];
  const int64_t head_dim = layout.head_dim, group_size = num_heads / layout.num_kv_heads;
  const AttentionShared at{group_size, head_dim};
  float* query = shared + at.queries();  // [G, hd]
  float* acc = shared + at.outputs();    // [G, hd]
  float* tile = shared + at.tile();      // [kKeysPerTile, hd + 1]
  float* weights = shared + at.weights();  // [G, kKeysPerTile]
  float* running_max = shared + at.stats(), *running_sum = running_max + group_size, *rescale = running_sum + group_size;
  const int64_t t = blockIdx.x / layout.num_kv_heads, kv_head = blockIdx.x % layout.num_kv_heads;
  const int split = int(blockIdx.y);
  const int64_t r = rows.token_row[t];
  if (skip_chunked_rows && rows.row_tokens[r] > 1) return;
  const int64_t num_keys = rows.start_position[r] + t - rows.first_token[r] + 1;
  const int64_t keys_per_split = (num_keys + num_splits - 1) / num_splits;
  const int64_t first_key = min(num_keys, split * keys_per_split);
  const int64_t end_key = min(num_keys, first_key + keys_per_split);  // an empty split leaves m = -inf, l = 0
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
  for (int64_t first = first_key; first < end_key; first += kKeysPerTile) {
    const int count = int(min(int64_t(kKeysPerTile), end_key - first));
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
  __syncthreads();  // the stats are complete (a split without keys never entered the loop)
  if (num_splits == 1) {
    float* out = context + device_offset(t, num_heads * head_dim) + device_offset(kv_head, group_width);
    for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) out[i] = acc[i] / running_sum[i / head_dim];
    return;
  }
  for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) {
    const int64_t head = device_offset(kv_head, group_size) + i / head_dim, e = i % head_dim;
    float* entry = partial + device_offset(device_offset(t, num_heads) + head, device_offset(num_splits, head_dim + 2)) +
                   device_offset(split, head_dim + 2);
    entry[e] = acc[i];
    if (e == 0) entry[head_dim] = running_max[i / head_dim], entry[head_dim + 1] = running_sum[i / head_dim];
  }
}

// One block per (token, query head): context = sum_s exp(m_s - M) outputs_s / sum_s exp(m_s - M) l_s over the
// splits s, M the largest m_s (an empty split has m_s = -inf and weighs nothing).
__global__ void combine_splits_kernel(DeviceRows rows, int64_t num_heads, int64_t head_dim, int num_splits,
                                      bool skip_chunked_rows,
                                      const float* partial,  // [T, nh, num_splits, hd + 2]
                                      float* context) {      // [T, nh*hd]
  const int64_t pair = blockIdx.x;  // t * nh + head
  if (skip_chunked_rows && rows.row_tokens[rows.token_row[pair / num_heads]] > 1) return;
  const float* entries = partial + device_offset(pair, device_offset(num_splits, head_dim + 2));
  float top = -INFINITY;
  for (int s = 0; s < num_splits; ++s) top = fmaxf(top, entries[device_offset(s, head_dim + 2) + head_dim]);
  float total = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float* entry = entries + device_offset(s, head_dim + 2);
    total += expf(entry[head_dim] - top) * entry[head_dim + 1];
  }
  for (int64_t e = threadIdx.x; e < head_dim; e += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      const float* entry = entries + device_offset(s, head_dim + 2);
      sum += expf(entry[head_dim] - top) * entry[e];
    }
    context[device_offset(pair, head_dim) + e] = sum / total;
  }
}

// Tensor-core attention for the rows of several tokens (prefill) in the 16-bit mode: queries, keys and values
// rounded to bf16 (as every GEMM input of that mode), scores and outputs accumulated in fp32, the softmax in
// fp32. One block per (scan chunk of a row: up to 64 query tokens, query head); each of its four warps takes 16
// of the chunk's tokens. The block stages the keys and values of kMmaKeys positions at a time in shared memory
// (read once for its four warps), and each warp runs S = Q Kᵀ, the online softmax of its rows with the causal
// mask, and O = O * rescale + P V on the tensor cores (WMMA 16x16x16).
constexpr int kMmaTile = 16;
constexpr int kMmaWarps = 4;
constexpr int kMmaKeys = 64;
constexpr int kMmaMaxHeadDim = 128;
static_assert(kMmaWarps * kMmaTile == kScanChunkTokens, "a block's warps cover one scan chunk");

// Shared memory of attention_mma_kernel, in bytes from its start; every region a multiple of 32 bytes (WMMA).
struct MmaShared {
  int64_t head_dim;
  JAMBO_HOST_DEVICE int64_t keys() const { return 0; }                                      // bf16 [kMmaKeys, hd]
  JAMBO_HOST_DEVICE int64_t values() const { return keys() + kMmaKeys * head_dim * 2; }     // bf16 [kMmaKeys, hd]
  JAMBO_HOST_DEVICE int64_t queries() const { return values() + kMmaKeys * head_dim * 2; }  // bf16 [warps, 16, hd]
  JAMBO_HOST_DEVICE int64_t outputs() const { return queries() + kMmaWarps * kMmaTile * head_dim * 2; }  // f32 [warps, 16, hd]
  JAMBO_HOST_DEVICE int64_t scores() const { return outputs() + kMmaWarps * kMmaTile * head_dim * 4; }  // f32 [warps, 16, keys]
  JAMBO_HOST_DEVICE int64_t weights() const { return scores() + kMmaWarps * kMmaTile * kMmaKeys * 4; }  // bf16 [warps, 16, keys]
  JAMBO_HOST_DEVICE int64_t stats() const { return weights() + kMmaWarps * kMmaTile * kMmaKeys * 2; }   // f32 [warps, 3, 16]
  JAMBO_HOST_DEVICE int64_t num_bytes() const { return stats() + kMmaWarps * 3 * kMmaTile * 4; }
};

__global__ void __launch_bounds__(kMmaWarps * kWarpSize)
    attention_mma_kernel(DeviceRows rows, KvLayout layout, int64_t num_heads,
                         const float* queries,  // [T, nh*hd]
                         const float* kv_pool,  // [num_blocks, block_stride]
                         float* context) {      // [T, nh*hd]
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  const int head_dim = int(layout.head_dim);
  const MmaShared at{head_dim};
  __nv_bfloat16* keys = reinterpret_cast<__nv_bfloat16*>(shared_bytes + at.keys());
  __nv_bfloat16* values = reinterpret_cast<__nv_bfloat16*>(shared_bytes + at.values());
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  __nv_bfloat16* query = reinterpret_cast<__nv_bfloat16*>(shared_bytes + at.queries()) + warp * kMmaTile * head_dim;
  float* out = reinterpret_cast<float*>(shared_bytes + at.outputs()) + warp * kMmaTile * head_dim;
  float* scores = reinterpret_cast<float*>(shared_bytes + at.scores()) + warp * kMmaTile * kMmaKeys;
  __nv_bfloat16* weights = reinterpret_cast<__nv_bfloat16*>(shared_bytes + at.weights()) + warp * kMmaTile * kMmaKeys;
  float* running_max = reinterpret_cast<float*>(shared_bytes + at.stats()) + warp * 3 * kMmaTile;
  float* running_sum = running_max + kMmaTile;
  float* rescale = running_sum + kMmaTile;

  const int64_t chunk = blockIdx.x, head = blockIdx.y;
  const int64_t kv_head = head / (num_heads / layout.num_kv_heads);
  const int64_t r = rows.chunk_row[chunk];
  const int64_t row_end = rows.first_token[r] + rows.row_tokens[r];
  const int64_t chunk_first = rows.chunk_first_token[chunk];
  const int64_t chunk_end = min(row_end, chunk_first + kScanChunkTokens);
  const int64_t position_of_first = rows.start_position[r] - rows.first_token[r];  // + t: position of token t
  const int64_t warp_first = chunk_first + warp * kMmaTile;
  const int num_queries = int(max(int64_t(0), min(int64_t(kMmaTile), chunk_end - warp_first)));
  const int64_t last_position = position_of_first + warp_first + num_queries - 1;  // of the warp's last query
  const int64_t num_keys = position_of_first + chunk_end;  // of the block: up to its last query's position

  for (int i = lane; i < kMmaTile * head_dim; i += kWarpSize) {
    const int q = i / head_dim, e = i % head_dim;
    const float value =
        q < num_queries ? queries[device_offset(warp_first + q, num_heads * head_dim) + device_offset(head, head_dim) + e]
                        : 0.0f;
    query[i] = __float2bfloat16_rn(value);
    out[i] = 0.0f;
  }
  if (lane < kMmaTile) running_max[lane] = -INFINITY, running_sum[lane] = 0.0f;
  const float scale = 1.0f / sqrtf(float(head_dim));

  for (int64_t first_key = 0; first_key < num_keys; first_key += kMmaKeys) {
    __syncthreads();  // the last tile's keys and values are no longer read
    for (int k = warp; k < kMmaKeys; k += kMmaWarps) {  // a warp per key: one block-table lookup per key
      const int64_t position = first_key + k;
      const bool inside = position < num_keys;
      const float* key = inside ? kv_pool + kv_entry(rows, layout, r, position, 0) + device_offset(kv_head, head_dim)
                                : nullptr;
      const float* value = inside ? key + layout.half_stride() : nullptr;  // a block's values follow its keys
      for (int e = lane; e < head_dim; e += kWarpSize) {
        keys[k * head_dim + e] = __float2bfloat16_rn(inside ? key[e] : 0.0f);
        values[k * head_dim + e] = __float2bfloat16_rn(inside ? value[e] : 0.0f);
      }
    }
    __syncthreads();
    if (num_queries == 0 || first_key > last_position) continue;  // every key of the tile is after the warp's queries

    for (int n = 0; n < kMmaKeys / kMmaTile; ++n) {  // S = Q Kᵀ, 16 keys at a time
      wmma::fragment<wmma::accumulator, kMmaTile, kMmaTile, kMmaTile, float> s;
      wmma::fill_fragment(s, 0.0f);
      for (int d = 0; d < head_dim; d += kMmaTile) {
        wmma::fragment<wmma::matrix_a, kMmaTile, kMmaTile, kMmaTile, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kMmaTile, kMmaTile, kMmaTile, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, query + d, head_dim);
        wmma::load_matrix_sync(b, keys + n * kMmaTile * head_dim + d, head_dim);
        wmma::mma_sync(s, a, b, s);
      }
      wmma::store_matrix_sync(scores + n * kMmaTile, s, kMmaKeys, wmma::mem_row_major);
    }
    __syncwarp();
    for (int q = 0; q < kMmaTile; ++q) {  // the online softmax, a row at a time: two keys per lane
      const int64_t query_position = position_of_first + warp_first + q;
      float score[2], weight[2];
      for (int j = 0; j < 2; ++j) {
        const int k = lane + j * kWarpSize;
        const bool visible = q < num_queries && first_key + k <= query_position;
        score[j] = visible ? scores[q * kMmaKeys + k] * scale : -INFINITY;
      }
      const float new_max = fmaxf(running_max[q], warp_max(fmaxf(score[0], score[1])));
      const bool none_yet = new_max == -INFINITY;  // a padding row, or no visible key so far
      for (int j = 0; j < 2; ++j) weight[j] = none_yet ? 0.0f : expf(score[j] - new_max);
      const float tile_sum = warp_sum(weight[0] + weight[1]);
      for (int j = 0; j < 2; ++j) weights[q * kMmaKeys + lane + j * kWarpSize] = __float2bfloat16_rn(weight[j]);
      __syncwarp();
      if (lane == 0) {
        const float factor = none_yet ? 1.0f : expf(running_max[q] - new_max);
        rescale[q] = factor;
        running_sum[q] = running_sum[q] * factor + tile_sum;
        running_max[q] = new_max;
      }
      __syncwarp();
    }
    for (int i = lane; i < kMmaTile * head_dim; i += kWarpSize) out[i] *= rescale[i / head_dim];
    __syncwarp();
    for (int j = 0; j < head_dim; j += kMmaTile) {  // O += P V, 16 output columns at a time
      wmma::fragment<wmma::accumulator, kMmaTile, kMmaTile, kMmaTile, float> o;
      wmma::load_matrix_sync(o, out + j, head_dim, wmma::mem_row_major);
      for (int k = 0; k < kMmaKeys; k += kMmaTile) {
        wmma::fragment<wmma::matrix_a, kMmaTile, kMmaTile, kMmaTile, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kMmaTile, kMmaTile, kMmaTile, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, weights + k, kMmaKeys);
        wmma::load_matrix_sync(b, values + k * head_dim + j, head_dim);
        wmma::mma_sync(o, a, b, o);
      }
      wmma::store_matrix_sync(out + j, o, head_dim, wmma::mem_row_major);
    }
    __syncwarp();
  }
  for (int i = lane; i < num_queries * head_dim; i += kWarpSize) {
    const int q = i / head_dim, e = i % head_dim;
    context[device_offset(warp_first + q, num_heads * head_dim) + device_offset(head, head_dim) + e] =
        out[i] / running_sum[q];
  }
}

int attention_splits(int64_t num_tokens, int64_t num_kv_heads) {
  static const int num_sms = [] {
    int device = 0, count = 0;
    JAMBO_CUDA_CHECK(cudaGetDevice(&device));
    JAMBO_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  const int64_t num_pairs = device_offset(num_tokens, num_kv_heads);
  const int64_t wanted = (int64_t(kBlocksPerSmWanted) * num_sms + num_pairs - 1) / num_pairs;
  return int(std::clamp<int64_t>(wanted, 1, kMaxSplits));
}

// The dynamic shared memory a block may opt in to on this GPU (GPU 0), asked once.
int max_shared_bytes() {
  static const int bytes = [] {
    int device = 0, value = 0;
    JAMBO_CUDA_CHECK(cudaGetDevice(&device));
    JAMBO_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return value;
  }();
  return bytes;
}

void require_shared_memory(size_t needed, const std::string& what) {
  require(needed <= size_t(max_shared_bytes()), what + " needs " + std::to_string(needed) +
                                                    " bytes of shared memory per block; this GPU allows " +
                                                    std::to_string(max_shared_bytes()));
}

// Lets `kernel` take up to max_shared_bytes() of dynamic shared memory; a launch takes what it needs. Callers
// keep the result in a static, so that the attribute is set once per kernel.
template <typename Kernel>
bool allow_max_shared_memory(Kernel kernel) {
  JAMBO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_bytes()));
  return true;
}

}  // namespace

void store_keys_and_values(const DeviceRows& rows, const KvLayout& layout, const float* keys, const float* values,
                           float* kv_pool, cudaStream_t stream) {
  const int64_t count = device_offset(rows.num_tokens, layout.token_stride());
  if (count == 0) return;
  store_kernel<<<num_blocks_for(count, kThreads), kThreads, 0, stream>>>(rows, layout, keys, values, kv_pool);
  JAMBO_CUDA_CHECK_LAUNCH(store_kernel);
}

bool attention_runs_on_tensor_cores(const DeviceRows& rows, const KvLayout& layout, bool sixteen_bit) {
  return sixteen_bit && rows.num_chunks > 0 && layout.head_dim % kMmaTile == 0 && layout.head_dim <= kMmaMaxHeadDim;
}

void paged_attention(const DeviceRows& rows, const KvLayout& layout, int64_t num_heads, const float* queries,
                     const float* kv_pool, float* context, DeviceBuffer<float>& partial, bool sixteen_bit,
                     cudaStream_t stream) {
  const int64_t num_pairs = device_offset(rows.num_tokens, layout.num_kv_heads);
  if (num_pairs == 0) return;
  const bool tensor_cores = attention_runs_on_tensor_cores(rows, layout, sixteen_bit);
  if (tensor_cores) {
    const size_t mma_bytes = size_t(MmaShared{layout.head_dim}.num_bytes());
    require_shared_memory(mma_bytes, "tensor-core attention of head dimension " + std::to_string(layout.head_dim));
    [[maybe_unused]] static const bool mma_allowed = allow_max_shared_memory(attention_mma_kernel);
    require(rows.num_chunks < 65536 && num_heads < 65536, "too many chunks or heads for one attention launch");
    attention_mma_kernel<<<dim3(unsigned(rows.num_chunks), unsigned(num_heads)), kMmaWarps * kWarpSize, mma_bytes,
                           stream>>>(rows, layout, num_heads, queries, kv_pool, context);
    JAMBO_CUDA_CHECK_LAUNCH(attention_mma_kernel);
  }
  require(num_pairs < (int64_t(1) << 31),
          "attention over " + std::to_string(num_pairs) + " (token, KV head) pairs is too many for one launch");
  const AttentionShared at{num_heads / layout.num_kv_heads, layout.head_dim};
  const size_t shared_bytes = size_t(at.num_floats()) * sizeof(float);
  require_shared_memory(shared_bytes, "attention with " + std::to_string(at.group_size) +
                                          " query heads per KV head of dimension " + std::to_string(layout.head_dim));
  [[maybe_unused]] static const bool allowed = allow_max_shared_memory(attention_kernel);
  const int num_splits = attention_splits(rows.num_tokens, layout.num_kv_heads);
  float* partial_data =
      num_splits == 1 ? nullptr
                      : partial.reserve(device_offset(device_offset(rows.num_tokens, num_heads),
                                                      device_offset(num_splits, layout.head_dim + 2)));
  attention_kernel<<<dim3(unsigned(num_pairs), unsigned(num_splits)), kThreads, shared_bytes, stream>>>(
      rows, layout, num_heads, num_splits, tensor_cores, queries, kv_pool, context, partial_data);
  JAMBO_CUDA_CHECK_LAUNCH(attention_kernel);
  if (num_splits == 1) return;
  combine_splits_kernel<<<unsigned(device_offset(rows.num_tokens, num_heads)), kCombineThreads, 0, stream>>>(
      rows, num_heads, layout.head_dim, num_splits, tensor_cores, partial_data, context);
  JAMBO_CUDA_CHECK_LAUNCH(combine_splits_kernel);
}

}  // namespace jambo::cuda
