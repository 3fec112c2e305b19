#include "backend/cuda/attention.h"
#include "backend/cuda/device_math.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kKeysPerTile = 32;  // one warp lane per key in the softmax
// A step of few tokens splits each token's keys among blocks, up to kMaxSplits, until there are about
// kBlocksPerSmWanted blocks per SM: one block walking a long context alone leaves the GPU idle (batch 1).
constexpr int kBlocksPerSmWanted = 4;
constexpr int kMaxSplits = 32;
constexpr int kCombineThreads = 128;

// One step's attention, as every attention kernel reads it (each takes the fields it needs).
struct AttentionParams {
  DeviceRows rows;
  KvLayout layout;
  int64_t num_heads = 0;           // nh
  int num_splits = 1;              // parts of each one-token row's keys; 1: the blocks write context themselves
  bool skip_chunked_rows = false;  // rows of several tokens are attention_mma_kernel's
  const float* queries = nullptr;  // [T, nh*hd]
  const float* kv_pool = nullptr;  // [num_blocks, block_stride]
  float* context = nullptr;        // [T, nh*hd]
  float* partial = nullptr;        // [T, nh, num_splits, hd + 2] (several splits)
};

// Element offset of a position's [nkv, hd] keys (key_or_value 0) or values (1) in the pool.
__device__ inline int64_t kv_entry(const DeviceRows& rows, const KvLayout& layout, int64_t row, int64_t position,
                                   int key_or_value) {
  const int64_t block = rows.block_tables[rows.block_table_offset[row] + position / layout.block_size];
  return device_offset(block, layout.block_stride) + layout.layer_offset +
         device_offset(key_or_value, layout.half_stride()) +
         device_offset(position % layout.block_size, layout.token_stride());
}

// The keys [first, end) of split `split` of token t's: its row's positions up to t's, in num_splits parts of equal
// size but the last (a split past the keys is empty: its m stays -inf and its l 0).
struct KeySplit {
  int64_t first, end;
};
__device__ inline KeySplit split_keys(const DeviceRows& rows, int64_t t, int split, int num_splits) {
  const int64_t r = rows.token_row[t];
  const int64_t num_keys = rows.start_position[r] + t - rows.first_token[r] + 1;
  const int64_t keys_per_split = (num_keys + num_splits - 1) / num_splits;
  const int64_t first = min(num_keys, split * keys_per_split);
  return {first, min(num_keys, first + keys_per_split)};
}

// A split's partial result for one (token, query head): its hd unnormalized outputs, then its running max m and
// sum l, in partial [T, nh, num_splits, hd + 2].
JAMBO_HOST_DEVICE inline int64_t partial_entry_size(int64_t head_dim) { return head_dim + 2; }

// Where split `split` of pair = t * nh + query head keeps its partial result in partial.
__device__ inline int64_t partial_entry(int64_t pair, int64_t split, int num_splits, int64_t head_dim) {
  return device_offset(device_offset(pair, num_splits) + split, partial_entry_size(head_dim));
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
                          int key_or_value, int64_t kv_head, const float* kv_pool, int64_t tile_stride,
                          float* tile) {  // [kKeysPerTile, tile_stride] shared
  const int head_dim = int(layout.head_dim);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, num_warps = blockDim.x / kWarpSize;
  for (int k = warp; k < count; k += num_warps) {
    const float* entry =
        kv_pool + kv_entry(rows, layout, r, first + k, key_or_value) + device_offset(kv_head, head_dim);
    for (int e = lane; e < head_dim; e += kWarpSize) tile[k * tile_stride + e] = entry[e];
  }
}

// One block per (token, KV head, split of the token's keys) for the G = nh / nkv query heads that share the KV
// head, so each key and value is read once for all of them. A split takes its keys a tile at a time with the
// online softmax: per head a running max m, running sum l and the unnormalized outputs, rescaled when m grows.
// With one split the block writes the context; with more, its (m, l, outputs) go to `partial` and
// combine_splits_kernel merges them.
__global__ void attention_kernel(const AttentionParams p) {
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  extern __shared__ float shared[];
  const int64_t head_dim = p.layout.head_dim, group_size = p.num_heads / p.layout.num_kv_heads;
  const AttentionShared at{group_size, head_dim};
  float* query = shared + at.queries();    // [G, hd]
  float* acc = shared + at.outputs();      // [G, hd]
  float* tile = shared + at.tile();        // [kKeysPerTile, hd + 1]
  float* weights = shared + at.weights();  // [G, kKeysPerTile]
  float *running_max = shared + at.stats(), *running_sum = running_max + group_size,
        *rescale = running_sum + group_size;
  const int64_t t = blockIdx.x / p.layout.num_kv_heads, kv_head = blockIdx.x % p.layout.num_kv_heads;
  const int split = int(blockIdx.y);
  const int64_t r = p.rows.token_row[t];
  if (p.skip_chunked_rows && p.rows.row_tokens[r] > 1) return;
  const auto [first_key, end_key] = split_keys(p.rows, t, split, p.num_splits);
  const float scale = 1.0f / sqrtf(float(head_dim));
  const int64_t group_width = group_size * head_dim;  // the group's query heads are contiguous
  const float* q_in = p.queries + device_offset(t, p.num_heads * head_dim) + device_offset(kv_head, group_width);
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
    load_tile(p.rows, p.layout, r, first, count, 0, kv_head, p.kv_pool, at.tile_stride(), tile);
    __syncthreads();
    for (int i = threadIdx.x; i < int(group_size) * count; i += blockDim.x) {
      const int h = i / count, k = i % count;
      float dot = 0.0f;
      for (int e = 0; e < int(head_dim); ++e) dot += query[h * head_dim + e] * tile[k * at.tile_stride() + e];
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
    // The values, over the keys: these are no longer read.
    load_tile(p.rows, p.layout, r, first, count, 1, kv_head, p.kv_pool, at.tile_stride(), tile);
    __syncthreads();
    for (int i = threadIdx.x; i < int(group_width); i += blockDim.x) {
      const int h = i / int(head_dim), e = i % int(head_dim);
      float sum = 0.0f;
      for (int k = 0; k < count; ++k) sum += weights[h * kKeysPerTile + k] * tile[k * at.tile_stride() + e];
      acc[i] = acc[i] * rescale[h] + sum;
    }
    __syncthreads();  // the tile and weights are rewritten by the next tile
  }
  __syncthreads();  // the stats are complete (a split without keys never entered the loop)
  if (p.num_splits == 1) {
    float* out = p.context + device_offset(t, p.num_heads * head_dim) + device_offset(kv_head, group_width);
    for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) out[i] = acc[i] / running_sum[i / head_dim];
    return;
  }
  for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) {
    const int64_t head = device_offset(kv_head, group_size) + i / head_dim, e = i % head_dim;
    float* entry = p.partial + partial_entry(device_offset(t, p.num_heads) + head, split, p.num_splits, head_dim);
    entry[e] = acc[i];
    if (e == 0) entry[head_dim] = running_max[i / head_dim], entry[head_dim + 1] = running_sum[i / head_dim];
  }
}

// One block per (token, query head): context = sum_s exp(m_s - M) outputs_s / sum_s exp(m_s - M) l_s over the
// splits s, M the largest m_s (an empty split has m_s = -inf and weighs nothing). The first warp takes the splits'
// (m, l) a lane each and leaves their weights in shared memory; then each thread sums one dimension over the splits,
// its loads independent of each other (a loop over the splits per step, one load after another, took 9 us at
// batch 1).
__global__ void combine_splits_kernel(const AttentionParams p) {
  static_assert(kMaxSplits <= kWarpSize, "a lane per split");
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  const int64_t head_dim = p.layout.head_dim, pair = blockIdx.x;  // pair: t * nh + head
  if (p.skip_chunked_rows && p.rows.row_tokens[p.rows.token_row[pair / p.num_heads]] > 1) return;
  const float* entries = p.partial + partial_entry(pair, 0, p.num_splits, head_dim);  // [num_splits, hd + 2]
  const int64_t entry_size = partial_entry_size(head_dim);
  __shared__ float weights[kMaxSplits];  // exp(m_s - M) / sum_s exp(m_s - M) l_s
  if (threadIdx.x < kWarpSize) {
    const int s = int(threadIdx.x);
    const float* entry = entries + device_offset(s, entry_size);
    const float m = s < p.num_splits ? entry[head_dim] : -INFINITY, l = s < p.num_splits ? entry[head_dim + 1] : 0.0f;
    const float weight = expf(m - warp_max(m));  // some split has keys: the max is finite
    const float total = warp_sum(weight * l);
    if (s < p.num_splits) weights[s] = weight / total;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < head_dim; e += blockDim.x) {
    float sum = 0.0f;
#pragma unroll 8
    for (int s = 0; s < p.num_splits; ++s) sum += weights[s] * entries[device_offset(s, entry_size) + e];
    p.context[device_offset(pair, head_dim) + e] = sum;
  }
}

// Tensor-core attention for the rows of several tokens (prefill) in the 16-bit mode: queries, keys and values
// rounded to bf16 (as every GEMM input of that mode), scores and outputs accumulated in fp32, the softmax in
// fp32, the weights rounded to bf16 for P V. One block per (scan chunk of a row: up to 64 query tokens, query
// head); each of its four warps takes 16 of the chunk's tokens and keeps their queries, scores, running max and
// sum and outputs in registers (mma.sync m16n8k16 fragments, flash-attention style). The block stages the keys
// and values of kMmaKeys positions at a time in shared memory as bf16, read once for its four warps.
constexpr int kMmaRows = 16;  // an mma's rows: a warp's query tokens (prefill) or query heads (decode)
constexpr int kMmaWarps = 4;
constexpr int kMmaKeys = 64;
constexpr int kMmaMaxHeadDim = 128;
constexpr int kMmaDimTiles = kMmaMaxHeadDim / 16;   // k-steps of Q Kᵀ and pairs of 8-wide output tiles of P V
constexpr int kMmaTileStride = kMmaMaxHeadDim + 8;  // bf16 per staged key: rows 16 bytes apart mod 128 (no conflicts)
static_assert(kMmaWarps * kMmaRows == kScanChunkTokens, "a block's warps cover one scan chunk");

// Two fp32 values as the packed bf16 pair an mma fragment register holds (lower index in the low half).
__device__ inline uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Four 8x8 bf16 matrices from shared memory, lane l giving the address of row l % 8 of matrix l / 8; `transpose`
// hands each lane its column entries instead of its row entries.
template <bool kTranspose>
__device__ inline void load_matrices(uint32_t (&out)[4], const __nv_bfloat16* row) {
  const unsigned address = unsigned(__cvta_generic_to_shared(row));
  if constexpr (kTranspose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
                 : "r"(address));
}

// acc[16x8] += a[16x16] b[16x8], bf16 inputs, fp32 accumulation. Fragments (PTX ISA, lane = 4 g + c):
// a {row g, row g + 8} x {cols 2c, 2c + 1} then the same 8 columns on; b {k 2c, 2c + 1} then k + 8, at column g;
// acc {row g: cols 2c, 2c + 1; row g + 8: the same columns}.
__device__ inline void mma_bf16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The block's keys and values at positions first_key + k, k < kMmaKeys, as bf16 rows of the two tiles; positions
// from end_key on are zeros (a zero value keeps 0 * value finite).
__device__ void stage_keys_and_values(const DeviceRows& rows, const KvLayout& layout, int64_t r, int64_t kv_head,
                                      int64_t first_key, int64_t end_key, const float* kv_pool,
                                      int64_t* entries,         // [kMmaKeys] shared
                                      __nv_bfloat16* keys,      // [kMmaKeys, kMmaTileStride] shared
                                      __nv_bfloat16* values) {  // [kMmaKeys, kMmaTileStride] shared
  const int head_dim = int(layout.head_dim), quads = head_dim / 4;
  for (int k = threadIdx.x; k < kMmaKeys; k += blockDim.x)
    entries[k] =
        first_key + k < end_key ? kv_entry(rows, layout, r, first_key + k, 0) + device_offset(kv_head, head_dim) : -1;
  __syncthreads();
#pragma unroll 4
  for (int i = threadIdx.x; i < kMmaKeys * quads; i += blockDim.x) {
    const int k = i / quads, e = 4 * (i % quads);
    const int64_t entry = entries[k];
    float4 key = {0.0f, 0.0f, 0.0f, 0.0f}, value = key;
    if (entry >= 0) {  // a block's values follow its keys
      key = *reinterpret_cast<const float4*>(kv_pool + entry + e);
      value = *reinterpret_cast<const float4*>(kv_pool + entry + layout.half_stride() + e);
    }
    uint2* key_out = reinterpret_cast<uint2*>(keys + k * kMmaTileStride + e);
    uint2* value_out = reinterpret_cast<uint2*>(values + k * kMmaTileStride + e);
    *key_out = {pack_bf16(key.x, key.y), pack_bf16(key.z, key.w)};
    *value_out = {pack_bf16(value.x, value.y), pack_bf16(value.z, value.w)};
  }
  __syncthreads();
}

// A warp's 16 query rows (tokens of a prefill chunk, or query heads of a decode token) as A fragments, one per 16
// dimensions, read from first_row + i * row_stride; rows from num_rows on are zeros.
__device__ inline void load_query_fragments(const float* first_row, int64_t row_stride, int num_rows, int dim_tiles,
                                            uint32_t (&query)[kMmaDimTiles][4]) {
  const int g = threadIdx.x % kWarpSize / 4, c = threadIdx.x % 4;
#pragma unroll
  for (int d = 0; d < kMmaDimTiles; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i % 2), col = 16 * d + 2 * c + 8 * (i / 2);
      float2 pair = {0.0f, 0.0f};
      if (d < dim_tiles && row < num_rows)
        pair = *reinterpret_cast<const float2*>(first_row + device_offset(row, row_stride) + col);
      query[d][i] = pack_bf16(pair.x, pair.y);
    }
}

// One warp's flash-attention state over its 16 query rows: the outputs O (8 dimensions per tile), and rows g and
// g + 8's running max (in base 2, the same in the row's four lanes) and running sum (this lane's part until
// finish()). attend() takes the block's staged keys and values, with the online softmax.
struct WarpAttention {
  float out[2 * kMmaDimTiles][4] = {};
  float running_max[2] = {-INFINITY, -INFINITY}, running_sum[2] = {0.0f, 0.0f};

  // S = Q Kᵀ over the kMmaKeys staged positions from first_key, masked where visible(key position, row) is false,
  // then O += P V.
  template <typename Visible>
  __device__ void attend(const uint32_t (&query)[kMmaDimTiles][4], const __nv_bfloat16* keys,
                         const __nv_bfloat16* values, int64_t first_key, int dim_tiles, float scale, Visible visible) {
    const int lane = threadIdx.x % kWarpSize, g = lane / 4, c = lane % 4;
    float score[kMmaKeys / 8][4] = {};  // 8 keys per tile
#pragma unroll
    for (int n = 0; n < kMmaKeys / 16; ++n)
#pragma unroll
      for (int d = 0; d < kMmaDimTiles; ++d) {
        if (d >= dim_tiles) break;
        uint32_t b[4];  // keys 16n .. +7 then +8 .. +15, each dimensions 16d .. +7 and +8 .. +15
        const int m = lane / 8;
        load_matrices<false>(b, keys + (16 * n + 8 * (m / 2) + lane % 8) * kMmaTileStride + 16 * d + 8 * (m % 2));
        mma_bf16(score[2 * n], query[d], b[0], b[1]);
        mma_bf16(score[2 * n + 1], query[d], b[2], b[3]);
      }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kMmaKeys / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        score[n][i] = visible(first_key + 8 * n + 2 * c + i % 2, g + 8 * (i / 2)) ? score[n][i] * scale : -INFINITY;
        tile_max[i / 2] = fmaxf(tile_max[i / 2], score[n][i]);
      }
    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the row's max over its four lanes; finite once a row has seen a visible key
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float new_max = fmaxf(running_max[h], tile_max[h]);
      rescale[h] = exp2f(running_max[h] - new_max);  // 0 on the first tile
      running_max[h] = new_max;
      running_sum[h] *= rescale[h];
    }
    uint32_t weights[kMmaKeys / 16][4];  // P as A fragments: S's tiles 2j and 2j + 1 are k-step j's halves
#pragma unroll
    for (int n = 0; n < kMmaKeys / 8; ++n) {
      float p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        p[i] = exp2f(score[n][i] - running_max[i / 2]);
        running_sum[i / 2] += p[i];
      }
      weights[n / 2][2 * (n % 2)] = pack_bf16(p[0], p[1]);
      weights[n / 2][2 * (n % 2) + 1] = pack_bf16(p[2], p[3]);
    }
#pragma unroll
    for (int t = 0; t < 2 * kMmaDimTiles; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) out[t][i] *= rescale[i / 2];
#pragma unroll
    for (int d = 0; d < kMmaDimTiles; ++d) {  // O += P V, 16 output dimensions at a time
      if (d >= dim_tiles) break;
#pragma unroll
      for (int j = 0; j < kMmaKeys / 16; ++j) {
        uint32_t b[4];  // keys 16j .. +7 then +8 .. +15 at dimensions 16d .. +7, then both at +8 .. +15
        const int m = lane / 8;
        load_matrices<true>(b, values + (16 * j + 8 * (m % 2) + lane % 8) * kMmaTileStride + 16 * d + 8 * (m / 2));
        mma_bf16(out[2 * d], weights[j], b[0], b[1]);
        mma_bf16(out[2 * d + 1], weights[j], b[2], b[3]);
      }
    }
  }

  // Walks the keys [first_key, end_key) of row r's KV head kv_head a kMmaKeys tile at a time, staged in shared
  // memory as bf16 for the block's warps; the warp attends a tile where takes(the tile's first key) holds. Every
  // thread of the block calls it: the staging has barriers.
  template <typename Takes, typename Visible>
  __device__ void attend_keys(const uint32_t (&query)[kMmaDimTiles][4], const DeviceRows& rows, const KvLayout& layout,
                              int64_t r, int64_t kv_head, int64_t first_key, int64_t end_key, const float* kv_pool,
                              Takes takes, Visible visible) {
    __shared__ __align__(16) __nv_bfloat16 keys[kMmaKeys * kMmaTileStride];    // [kMmaKeys, hd (padded)]
    __shared__ __align__(16) __nv_bfloat16 values[kMmaKeys * kMmaTileStride];  // [kMmaKeys, hd (padded)]
    __shared__ int64_t entries[kMmaKeys];  // pool offset of each staged position's key, -1 past the last
    const int head_dim = int(layout.head_dim);
    const float scale = 1.4426950408889634f / sqrtf(float(head_dim));  // 1/sqrt(hd) in base 2 (exp2f)
    for (int64_t first = first_key; first < end_key; first += kMmaKeys) {
      stage_keys_and_values(rows, layout, r, kv_head, first, end_key, kv_pool, entries, keys, values);
      if (takes(first)) attend(query, keys, values, first, head_dim / 16, scale, visible);
      __syncthreads();  // the tiles are restaged next
    }
  }

  // Completes each row's running sum over its four lanes.
  __device__ void finish() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      running_sum[h] += __shfl_xor_sync(0xffffffffu, running_sum[h], 1);
      running_sum[h] += __shfl_xor_sync(0xffffffffu, running_sum[h], 2);
    }
  }

  // Row i's outputs (divided by its sum when normalized) to first_row + i * row_stride, for rows below num_rows;
  // unnormalized, also its max (natural log base, as attention_kernel's) and sum after them, as a split's partial
  // result [hd + 2].
  __device__ void store(float* first_row, int64_t row_stride, int num_rows, int head_dim, bool normalized) const {
    const int g = threadIdx.x % kWarpSize / 4, c = threadIdx.x % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (g + 8 * h >= num_rows) continue;
      float* row = first_row + device_offset(g + 8 * h, row_stride);
      const float factor = normalized ? 1.0f / running_sum[h] : 1.0f;
#pragma unroll
      for (int t = 0; t < 2 * kMmaDimTiles; ++t)
        if (8 * t < head_dim)
          *reinterpret_cast<float2*>(row + 8 * t + 2 * c) = float2{out[t][2 * h] * factor, out[t][2 * h + 1] * factor};
      if (!normalized && c == 0)
        row[head_dim] = running_max[h] * 0.6931471805599453f, row[head_dim + 1] = running_sum[h];
    }
  }
};

__global__ void __launch_bounds__(kMmaWarps* kWarpSize) attention_mma_kernel(const AttentionParams p) {
  const int head_dim = int(p.layout.head_dim), dim_tiles = head_dim / 16;
  const int warp = threadIdx.x / kWarpSize;

  const int64_t chunk = p.rows.num_chunks - 1 - blockIdx.x;  // the longest chunks (a row's last) first
  const int64_t head = blockIdx.y, kv_head = head / (p.num_heads / p.layout.num_kv_heads);
  const int64_t r = p.rows.chunk_row[chunk];
  const int64_t chunk_first = p.rows.chunk_first_token[chunk];
  const int64_t chunk_end = min(p.rows.first_token[r] + p.rows.row_tokens[r], chunk_first + kScanChunkTokens);
  const int64_t position_of_first = p.rows.start_position[r] - p.rows.first_token[r];  // + t: position of token t
  const int64_t warp_first = chunk_first + warp * kMmaRows;
  const int num_queries = int(max(int64_t(0), min(int64_t(kMmaRows), chunk_end - warp_first)));
  const int64_t first_position = position_of_first + warp_first;  // of the warp's first query
  const int64_t last_position = first_position + num_queries - 1;
  const int64_t num_keys = position_of_first + chunk_end;  // of the block: up to its last query's position

  const int64_t query_stride = p.num_heads * head_dim;
  uint32_t query[kMmaDimTiles][4];
  load_query_fragments(p.queries + device_offset(warp_first, query_stride) + device_offset(head, head_dim),
                       query_stride, num_queries, dim_tiles, query);
  WarpAttention attention;
  attention.attend_keys(
      query, p.rows, p.layout, r, kv_head, 0, num_keys, p.kv_pool,
      [&](int64_t first_key) { return num_queries > 0 && first_key <= last_position; },
      [&](int64_t key_position, int row) { return key_position <= first_position + row; });
  attention.finish();
  attention.store(p.context + device_offset(warp_first, query_stride) + device_offset(head, head_dim), query_stride,
                  num_queries, head_dim, /*normalized=*/true);
}

// Tensor-core attention for the rows of one token (decode) in the 16-bit mode, rounding as attention_mma_kernel:
// the G query heads that share a KV head are the mma's rows, 16 to a warp (MQA's 20 take two warps, the block's other
// warps help stage), so that a token's keys and values are read once for all of them. One block per (token, KV
// head, split of the token's keys), as attention_kernel, whose results (context, or partial for
// combine_splits_kernel) it writes in the same form. H200, 3B shape, batch 256 (about 550 keys a token): 89 us an
// attention layer, against 297 on the fp32 kernel, which is bound by its shared-memory reads.
__global__ void __launch_bounds__(kMmaWarps* kWarpSize) attention_decode_mma_kernel(const AttentionParams p) {
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  const int head_dim = int(p.layout.head_dim), dim_tiles = head_dim / 16;
  const int64_t t = blockIdx.x / p.layout.num_kv_heads, kv_head = blockIdx.x % p.layout.num_kv_heads;
  const int64_t r = p.rows.token_row[t];
  if (p.rows.row_tokens[r] > 1) return;  // attention_mma_kernel's
  const KeySplit split = split_keys(p.rows, t, int(blockIdx.y), p.num_splits);
  const int64_t group_size = p.num_heads / p.layout.num_kv_heads;
  const int64_t first_head = device_offset(kv_head, group_size) + int64_t(threadIdx.x / kWarpSize) * kMmaRows;
  const int num_rows =
      int(max(int64_t(0), min(int64_t(kMmaRows), device_offset(kv_head + 1, group_size) - first_head)));

  uint32_t query[kMmaDimTiles][4];
  load_query_fragments(p.queries + device_offset(t, p.num_heads * head_dim) + device_offset(first_head, head_dim),
                       head_dim, num_rows, dim_tiles, query);
  WarpAttention attention;
  attention.attend_keys(
      query, p.rows, p.layout, r, kv_head, split.first, split.end, p.kv_pool, [&](int64_t) { return num_rows > 0; },
      [&](int64_t key_position, int) { return key_position < split.end; });
  attention.finish();
  if (p.num_splits == 1)
    attention.store(p.context + device_offset(t, p.num_heads * head_dim) + device_offset(first_head, head_dim),
                    head_dim, num_rows, head_dim, /*normalized=*/true);
  else
    attention.store(
        p.partial + partial_entry(device_offset(t, p.num_heads) + first_head, blockIdx.y, p.num_splits, head_dim),
        device_offset(p.num_splits, partial_entry_size(head_dim)), num_rows, head_dim,
        /*normalized=*/false);
}

// An attribute of the current GPU (callers keep it in a static: asked once).
int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  JAMBO_CUDA_CHECK(cudaGetDevice(&device));
  JAMBO_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

int attention_splits(int64_t num_tokens, int64_t num_kv_heads) {
  static const int num_sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  const int64_t num_pairs = device_offset(num_tokens, num_kv_heads);
  const int64_t wanted = (int64_t(kBlocksPerSmWanted) * num_sms + num_pairs - 1) / num_pairs;
  return int(std::clamp<int64_t>(wanted, 1, kMaxSplits));
}

// The dynamic shared memory a block may opt in to on this GPU.
int max_shared_bytes() {
  static const int bytes = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
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
  return sixteen_bit && rows.num_chunks > 0 && layout.head_dim % 16 == 0 && layout.head_dim <= kMmaMaxHeadDim;
}

bool decode_runs_on_tensor_cores(const KvLayout& layout, int64_t num_heads, bool sixteen_bit) {
  return sixteen_bit && layout.head_dim % 16 == 0 && layout.head_dim <= kMmaMaxHeadDim &&
         num_heads / layout.num_kv_heads <= kMmaWarps * kMmaRows;
}

void paged_attention(const DeviceRows& rows, const KvLayout& layout, int64_t num_heads, const float* queries,
                     const float* kv_pool, float* context, DeviceBuffer<float>& partial, bool sixteen_bit,
                     cudaStream_t stream) {
  const int64_t num_pairs = device_offset(rows.num_tokens, layout.num_kv_heads);
  if (num_pairs == 0) return;
  AttentionParams p{.rows = rows,
                    .layout = layout,
                    .num_heads = num_heads,
                    .skip_chunked_rows = attention_runs_on_tensor_cores(rows, layout, sixteen_bit),
                    .queries = queries,
                    .kv_pool = kv_pool,
                    .context = context};
  if (p.skip_chunked_rows) {
    require(rows.num_chunks < (int64_t(1) << 31) && num_heads < 65536,
            "too many chunks or heads for one attention launch");
    attention_mma_kernel<<<dim3(unsigned(rows.num_chunks), unsigned(num_heads)), kMmaWarps * kWarpSize, 0, stream>>>(p);
    JAMBO_CUDA_CHECK_LAUNCH(attention_mma_kernel);
  }
  require(num_pairs < (int64_t(1) << 31),
          "attention over " + std::to_string(num_pairs) + " (token, KV head) pairs is too many for one launch");
  p.num_splits = attention_splits(rows.num_tokens, layout.num_kv_heads);
  if (p.num_splits > 1)
    p.partial = partial.reserve(device_offset(device_offset(rows.num_tokens, num_heads),
                                              device_offset(p.num_splits, partial_entry_size(layout.head_dim))));
  const dim3 grid{unsigned(num_pairs), unsigned(p.num_splits)};
  const bool decode_tensor_cores = decode_runs_on_tensor_cores(layout, num_heads, sixteen_bit);
  require(!decode_tensor_cores || rows.num_chunks == 0 || p.skip_chunked_rows,
          "the tensor-core decode attention leaves rows of several tokens to the tensor-core prefill attention, which "
          "does not take these rows (please report this)");
  if (decode_tensor_cores) {
    launch_early(attention_decode_mma_kernel, grid, dim3(kMmaWarps * kWarpSize), 0, stream, p);
  } else {
    const AttentionShared at{num_heads / layout.num_kv_heads, layout.head_dim};
    const size_t shared_bytes = size_t(at.num_floats()) * sizeof(float);
    require_shared_memory(shared_bytes, "attention with " + std::to_string(at.group_size) +
                                            " query heads per KV head of dimension " + std::to_string(layout.head_dim));
    [[maybe_unused]] static const bool allowed = allow_max_shared_memory(attention_kernel);
    launch_early(attention_kernel, grid, dim3(kThreads), shared_bytes, stream, p);
  }
  if (p.num_splits == 1) return;
  launch_early(combine_splits_kernel, dim3(unsigned(device_offset(rows.num_tokens, num_heads))), dim3(kCombineThreads),
               0, stream, p);
}

}  // namespace jambo::backend::cuda
