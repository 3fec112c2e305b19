#include "backend/cuda/attention.h"
#include "backend/cuda/device_math.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kKeysPerTile = 32;  // one warp lane per key in the softmax
static_assert(kAttentionSplitKeys % kKeysPerTile == 0, "a split is whole tiles");
// A decode step of few tokens gives each token's splits to several blocks (workers), up to kMaxWorkers, until there
// are about kBlocksPerSmWanted blocks per SM: one block walking a long context alone leaves the GPU idle (batch 1).
constexpr int kBlocksPerSmWanted = 4;
constexpr int kMaxWorkers = 32;
constexpr int kCombineThreads = 128;

// One step's attention, as every attention kernel reads it (each takes the fields it needs).
struct AttentionParams {
  DeviceRows rows;
  KvLayout layout;
  int64_t num_heads = 0;           // nh
  int num_workers = 1;             // blocks sharing each one-token row's splits of keys
  bool skip_chunked_rows = false;  // rows of several tokens are attention_mma_kernel's
  const float* queries = nullptr;  // [T, nh*hd]
  const float* kv_pool = nullptr;  // [num_blocks, block_stride]
  float* context = nullptr;        // [T, nh*hd]
  float* partial = nullptr;        // [rows.num_splits, nh, hd + 2] the one-token rows' splits
};

// Element offset of a position's [nkv, hd] keys (key_or_value 0) or values (1) in the pool.
__device__ inline int64_t kv_entry(const DeviceRows& rows, const KvLayout& layout, int64_t row, int64_t position,
                                   int key_or_value) {
  const int64_t block = rows.block_tables[rows.block_table_offset[row] + position / layout.block_size];
  return device_offset(block, layout.block_stride) + layout.layer_offset +
         device_offset(key_or_value, layout.half_stride()) +
         device_offset(position % layout.block_size, layout.token_stride());
}

// The position of step token t.
__device__ inline int64_t token_position(const DeviceRows& rows, int64_t t) {
  const int64_t r = rows.token_row[t];
  return rows.start_position[r] + t - rows.first_token[r];
}

// The keys [first, end) of split `split` of a query that sees num_keys positions (kAttentionSplitKeys from
// split * kAttentionSplitKeys, the last split shorter).
struct KeySplit {
  int64_t first, end;
};
__device__ inline KeySplit key_split(int64_t num_keys, int64_t split) {
  const int64_t first = split * kAttentionSplitKeys;
  return {first, min(num_keys, first + kAttentionSplitKeys)};
}

// A split's partial result for one (one-token row, query head): its hd unnormalized outputs, then its running max m
// and sum l, in partial [num_splits, nh, hd + 2].
JAMBO_HOST_DEVICE inline int64_t partial_entry_size(int64_t head_dim) { return head_dim + 2; }

// Where the step's split `split` (row_first_split + the row's split) keeps query head `head`'s partial result.
__device__ inline int64_t partial_entry(int64_t split, int64_t head, int64_t num_heads, int64_t head_dim) {
  return device_offset(device_offset(split, num_heads) + head, partial_entry_size(head_dim));
}

// A query's splits are folded into its result in split order, with this one function wherever that happens (in a
// prefill's kernel, or in combine_splits_kernel for a decode step), so that both give the same bits:
//   result = result * exp(M - M') + split * exp(m - M'), M' = max(M, m), for the outputs and the sum alike.
// The first split is taken as it is; a split without a visible key (m = -inf: a prefill query before the split's
// first position) is left out. kBase2: the maxima are in base 2 (the tensor-core kernels' exp2f), else natural.
struct FoldFactors {
  bool skip = false, take = false;
  float result = 1.0f, split = 0.0f;
};

template <bool kBase2>
__device__ inline FoldFactors fold_factors(float& result_max, float split_max) {
  FoldFactors f;
  if (split_max == -INFINITY) {
    f.skip = true;
  } else if (result_max == -INFINITY) {
    f.take = true;
    result_max = split_max;
  } else {
    const float new_max = fmaxf(result_max, split_max);
    f.result = kBase2 ? exp2f(result_max - new_max) : expf(result_max - new_max);
    f.split = kBase2 ? exp2f(split_max - new_max) : expf(split_max - new_max);
    result_max = new_max;
  }
  return f;
}

__device__ inline float folded(float result, float split, const FoldFactors& f) {
  if (f.skip) return result;
  if (f.take) return split;
  return __fmaf_rn(split, f.split, __fmul_rn(result, f.result));
}

// The context from a query's folded result.
__device__ inline float normalized(float output, float sum) { return __fdiv_rn(output, sum); }

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

// Shared memory of one attention block, in floats: the group's queries, a split's outputs and the folded result
// [G, hd] each, a tile of keys or values [kKeysPerTile, hd + 1] (padded so that a warp reading one entry of 32 keys
// hits 32 banks), the tile's weights [G, kKeysPerTile], each head's running max, sum and rescale factor [G] each, and
// the result's max and sum [G] each.
struct AttentionShared {
  int64_t group_size, head_dim;
  JAMBO_HOST_DEVICE int64_t tile_stride() const { return head_dim + 1; }
  JAMBO_HOST_DEVICE int64_t queries() const { return 0; }
  JAMBO_HOST_DEVICE int64_t outputs() const { return group_size * head_dim; }
  JAMBO_HOST_DEVICE int64_t result() const { return 2 * group_size * head_dim; }
  JAMBO_HOST_DEVICE int64_t tile() const { return 3 * group_size * head_dim; }
  JAMBO_HOST_DEVICE int64_t weights() const { return tile() + kKeysPerTile * tile_stride(); }
  JAMBO_HOST_DEVICE int64_t stats() const { return weights() + group_size * kKeysPerTile; }
  JAMBO_HOST_DEVICE int64_t result_stats() const { return stats() + 3 * group_size; }
  JAMBO_HOST_DEVICE int64_t num_floats() const { return result_stats() + 2 * group_size; }
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

// The fp32 kernel: one block per (token, KV head, worker) for the G = nh / nkv query heads that share the KV head,
// so each key and value is read once for all of them. A split takes its keys a tile at a time with the online
// softmax: per head a running max m, running sum l and the unnormalized outputs, rescaled when m grows. A token of
// a prefill (the first worker's) folds its splits in order into its result and writes its context; a token of a
// decode step gives its splits to the workers in turn, which write their (outputs, m, l) to `partial` for
// combine_splits_kernel to fold (or, a single split, fold and write it at once).
__global__ void attention_kernel(const AttentionParams p) {
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  extern __shared__ float shared[];
  const int64_t head_dim = p.layout.head_dim, group_size = p.num_heads / p.layout.num_kv_heads;
  const AttentionShared at{group_size, head_dim};
  float* query = shared + at.queries();    // [G, hd]
  float* acc = shared + at.outputs();      // [G, hd]
  float* result = shared + at.result();    // [G, hd]
  float* tile = shared + at.tile();        // [kKeysPerTile, hd + 1]
  float* weights = shared + at.weights();  // [G, kKeysPerTile]
  float *running_max = shared + at.stats(), *running_sum = running_max + group_size,
        *rescale = running_sum + group_size;
  float *result_max = shared + at.result_stats(), *result_sum = result_max + group_size;
  const int64_t t = blockIdx.x / p.layout.num_kv_heads, kv_head = blockIdx.x % p.layout.num_kv_heads;
  const int worker = int(blockIdx.y);
  const int64_t r = p.rows.token_row[t];
  const bool decode = p.rows.row_tokens[r] == 1;
  if (!decode && (p.skip_chunked_rows || worker != 0)) return;
  const int64_t position = token_position(p.rows, t), num_keys = position + 1;
  const int64_t num_splits = num_key_splits(position);
  const bool folds = !decode || num_splits == 1;  // else the splits go to partial
  const float scale = 1.0f / sqrtf(float(head_dim));
  const int64_t group_width = group_size * head_dim;  // the group's query heads are contiguous
  const float* q_in = p.queries + device_offset(t, p.num_heads * head_dim) + device_offset(kv_head, group_width);
  for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) {
    query[i] = q_in[i];
    result[i] = 0.0f;
  }
  for (int64_t h = threadIdx.x; h < group_size; h += blockDim.x) {
    result_max[h] = -INFINITY;
    result_sum[h] = 0.0f;
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, num_warps = blockDim.x / kWarpSize;
  for (int64_t split = decode ? worker : 0; split < num_splits; split += decode ? p.num_workers : 1) {
    for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) acc[i] = 0.0f;
    for (int64_t h = threadIdx.x; h < group_size; h += blockDim.x) {
      running_max[h] = -INFINITY;
      running_sum[h] = 0.0f;
    }
    const auto [first_key, end_key] = key_split(num_keys, split);
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
    if (folds) {
      for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) {
        float new_max = result_max[i / head_dim];
        result[i] = folded(result[i], acc[i], fold_factors<false>(new_max, running_max[i / head_dim]));
      }
      __syncthreads();  // every output has read the result's old max
      for (int64_t h = threadIdx.x; h < group_size; h += blockDim.x) {
        const FoldFactors f = fold_factors<false>(result_max[h], running_max[h]);
        result_sum[h] = folded(result_sum[h], running_sum[h], f);
      }
    } else {
      for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x) {
        const int64_t head = device_offset(kv_head, group_size) + i / head_dim, e = i % head_dim;
        float* entry = p.partial + partial_entry(p.rows.row_first_split[r] + split, head, p.num_heads, head_dim);
        entry[e] = acc[i];
        if (e == 0) entry[head_dim] = running_max[i / head_dim], entry[head_dim + 1] = running_sum[i / head_dim];
      }
    }
    __syncthreads();  // the split's outputs and stats are reset next
  }
  if (!folds || worker != 0) return;  // a decode token's single split is the first worker's
  float* out = p.context + device_offset(t, p.num_heads * head_dim) + device_offset(kv_head, group_width);
  for (int64_t i = threadIdx.x; i < group_width; i += blockDim.x)
    out[i] = normalized(result[i], result_sum[i / head_dim]);
}

// One block per (token, query head) of a decode step with several splits: folds the splits' partial results in
// order (fold_factors), a thread per output dimension, and writes the context. kBase2: as the kernel that wrote them.
template <bool kBase2>
__global__ void combine_splits_kernel(const AttentionParams p) {
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  const int64_t head_dim = p.layout.head_dim, pair = blockIdx.x;  // pair: t * nh + head
  const int64_t t = pair / p.num_heads, head = pair % p.num_heads, r = p.rows.token_row[t];
  if (p.rows.row_tokens[r] != 1) return;  // a prefill's kernel folds its splits itself
  const int64_t num_splits = num_key_splits(p.rows.start_position[r]);
  if (num_splits == 1) return;  // its one split's block wrote the context
  const int64_t first_split = p.rows.row_first_split[r];
  for (int64_t e = threadIdx.x; e < head_dim; e += blockDim.x) {
    float result = 0.0f, sum = 0.0f, max = -INFINITY;
#pragma unroll 4
    for (int64_t s = 0; s < num_splits; ++s) {
      const float* entry = p.partial + partial_entry(first_split + s, head, p.num_heads, head_dim);
      const FoldFactors f = fold_factors<kBase2>(max, entry[head_dim]);
      result = folded(result, entry[e], f);
      sum = folded(sum, entry[head_dim + 1], f);
    }
    p.context[device_offset(pair, head_dim) + e] = normalized(result, sum);
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

// Writes a warp's 16 query rows of an mma accumulator layout: row i to first_row + i * row_stride for rows below
// num_rows, its dimension pairs as pair(t, h) gives them (tile t of 8 dimensions, h: rows g or g + 8), then
// tail(row, h) for what follows the row's outputs.
template <typename Pair, typename Tail>
__device__ inline void store_rows(float* first_row, int64_t row_stride, int num_rows, int head_dim, Pair pair,
                                  Tail tail) {
  const int g = threadIdx.x % kWarpSize / 4, c = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (g + 8 * h >= num_rows) continue;
    float* row = first_row + device_offset(g + 8 * h, row_stride);
#pragma unroll
    for (int t = 0; t < 2 * kMmaDimTiles; ++t)
      if (8 * t < head_dim) *reinterpret_cast<float2*>(row + 8 * t + 2 * c) = pair(t, h);
    if (c == 0) tail(row, h);
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
    float rescale[2], exponent_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the row's max over its four lanes; finite once a row has seen a visible key
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float new_max = fmaxf(running_max[h], tile_max[h]);
      // A row that has seen no visible key yet (a prefill query before its split's first position) keeps zeros.
      exponent_max[h] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[h] = exp2f(running_max[h] - exponent_max[h]);  // 0 on the first tile
      running_max[h] = new_max;
      running_sum[h] *= rescale[h];
    }
    uint32_t weights[kMmaKeys / 16][4];  // P as A fragments: S's tiles 2j and 2j + 1 are k-step j's halves
#pragma unroll
    for (int n = 0; n < kMmaKeys / 8; ++n) {
      float p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        p[i] = exp2f(score[n][i] - exponent_max[i / 2]);
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

  // Row i's unnormalized outputs, then its max (base 2) and sum, to first_row + i * row_stride for rows below
  // num_rows: a split's partial result [hd + 2].
  __device__ void store_partial(float* first_row, int64_t row_stride, int num_rows, int head_dim) const {
    store_rows(
        first_row, row_stride, num_rows, head_dim,
        [&](int t, int h) {
          return float2{out[t][2 * h], out[t][2 * h + 1]};
        },
        [&](float* row, int h) { row[head_dim] = running_max[h], row[head_dim + 1] = running_sum[h]; });
  }
};

// A warp's 16 query rows' result over the splits folded so far (fold_factors), each lane holding WarpAttention's
// elements.
struct WarpResult {
  float out[2 * kMmaDimTiles][4] = {};
  float max[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};

  // Folds a split in, after its finish().
  __device__ void fold(const WarpAttention& split) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const FoldFactors f = fold_factors<true>(max[h], split.running_max[h]);
      sum[h] = folded(sum[h], split.running_sum[h], f);
#pragma unroll
      for (int t = 0; t < 2 * kMmaDimTiles; ++t)
#pragma unroll
        for (int i = 0; i < 2; ++i) out[t][2 * h + i] = folded(out[t][2 * h + i], split.out[t][2 * h + i], f);
    }
  }

  // Row i's context to first_row + i * row_stride, for rows below num_rows.
  __device__ void store(float* first_row, int64_t row_stride, int num_rows, int head_dim) const {
    store_rows(
        first_row, row_stride, num_rows, head_dim,
        [&](int t, int h) {
          return float2{normalized(out[t][2 * h], sum[h]), normalized(out[t][2 * h + 1], sum[h])};
        },
        [](float*, int) {});
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
  WarpResult result;
  for (int64_t s = 0; s < num_key_splits(num_keys - 1); ++s) {  // the block's splits, those of its last query
    const KeySplit split = key_split(num_keys, s);
    WarpAttention attention;
    attention.attend_keys(
        query, p.rows, p.layout, r, kv_head, split.first, split.end, p.kv_pool,
        [&](int64_t first_key) { return num_queries > 0 && first_key <= last_position; },
        [&](int64_t key_position, int row) {
          return key_position < split.end && key_position <= first_position + row;
        });
    attention.finish();
    result.fold(attention);
  }
  result.store(p.context + device_offset(warp_first, query_stride) + device_offset(head, head_dim), query_stride,
               num_queries, head_dim);
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
  const int64_t position = p.rows.start_position[r], num_splits = num_key_splits(position);
  const int64_t group_size = p.num_heads / p.layout.num_kv_heads;
  const int64_t first_head = device_offset(kv_head, group_size) + int64_t(threadIdx.x / kWarpSize) * kMmaRows;
  const int num_rows =
      int(max(int64_t(0), min(int64_t(kMmaRows), device_offset(kv_head + 1, group_size) - first_head)));

  uint32_t query[kMmaDimTiles][4];
  load_query_fragments(p.queries + device_offset(t, p.num_heads * head_dim) + device_offset(first_head, head_dim),
                       head_dim, num_rows, dim_tiles, query);
  for (int64_t s = blockIdx.y; s < num_splits; s += p.num_workers) {
    const KeySplit split = key_split(position + 1, s);
    WarpAttention attention;
    attention.attend_keys(
        query, p.rows, p.layout, r, kv_head, split.first, split.end, p.kv_pool, [&](int64_t) { return num_rows > 0; },
        [&](int64_t key_position, int) { return key_position < split.end; });
    attention.finish();
    if (num_splits == 1) {
      WarpResult result;
      result.fold(attention);
      result.store(p.context + device_offset(t, p.num_heads * head_dim) + device_offset(first_head, head_dim), head_dim,
                   num_rows, head_dim);
    } else {
      attention.store_partial(
          p.partial + partial_entry(p.rows.row_first_split[r] + s, first_head, p.num_heads, head_dim),
          partial_entry_size(head_dim), num_rows, head_dim);
    }
  }
}

int attention_workers(int64_t num_tokens, int64_t num_kv_heads) {
  static const int num_sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  const int64_t num_pairs = device_offset(num_tokens, num_kv_heads);
  const int64_t wanted = (int64_t(kBlocksPerSmWanted) * num_sms + num_pairs - 1) / num_pairs;
  return int(std::clamp<int64_t>(wanted, 1, kMaxWorkers));
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

bool attention_runs_on_tensor_cores(const KvLayout& layout, int64_t num_heads, bool sixteen_bit) {
  return sixteen_bit && layout.head_dim % 16 == 0 && layout.head_dim <= kMmaMaxHeadDim &&
         num_heads / layout.num_kv_heads <= kMmaWarps * kMmaRows;
}

int64_t attention_partial_size(const DeviceRows& rows, const KvLayout& layout, int64_t num_heads) {
  return device_offset(device_offset(rows.num_splits, num_heads), partial_entry_size(layout.head_dim));
}

void paged_attention(const DeviceRows& rows, const KvLayout& layout, int64_t num_heads, const float* queries,
                     const float* kv_pool, float* context, DeviceBuffer<float>& partial, bool sixteen_bit,
                     cudaStream_t stream) {
  const int64_t num_pairs = device_offset(rows.num_tokens, layout.num_kv_heads);
  if (num_pairs == 0) return;
  const bool tensor_cores = attention_runs_on_tensor_cores(layout, num_heads, sixteen_bit);
  AttentionParams p{.rows = rows,
                    .layout = layout,
                    .num_heads = num_heads,
                    .skip_chunked_rows = tensor_cores,
                    .queries = queries,
                    .kv_pool = kv_pool,
                    .context = context};
  if (tensor_cores && rows.num_chunks > 0) {
    require(rows.num_chunks < (int64_t(1) << 31) && num_heads < 65536,
            "too many chunks or heads for one attention launch");
    attention_mma_kernel<<<dim3(unsigned(rows.num_chunks), unsigned(num_heads)), kMmaWarps * kWarpSize, 0, stream>>>(p);
    JAMBO_CUDA_CHECK_LAUNCH(attention_mma_kernel);
  }
  if (tensor_cores && rows.num_splits == 0) return;  // no row of one token
  require(num_pairs < (int64_t(1) << 31),
          "attention over " + std::to_string(num_pairs) + " (token, KV head) pairs is too many for one launch");
  p.num_workers = attention_workers(rows.num_tokens, layout.num_kv_heads);
  // Reserved beforehand where the step replays a graph (CudaBackend::forward): this is then no allocation.
  p.partial = partial.reserve(attention_partial_size(rows, layout, num_heads));
  const dim3 grid{unsigned(num_pairs), unsigned(p.num_workers)};
  if (tensor_cores) {
    launch_early(attention_decode_mma_kernel, grid, dim3(kMmaWarps * kWarpSize), 0, stream, p);
  } else {
    const AttentionShared at{num_heads / layout.num_kv_heads, layout.head_dim};
    const size_t shared_bytes = size_t(at.num_floats()) * sizeof(float);
    require_shared_memory(shared_bytes, "attention with " + std::to_string(at.group_size) +
                                            " query heads per KV head of dimension " + std::to_string(layout.head_dim));
    [[maybe_unused]] static const bool allowed = allow_max_shared_memory(attention_kernel);
    launch_early(attention_kernel, grid, dim3(kThreads), shared_bytes, stream, p);
  }
  if (rows.num_splits == 0) return;  // no row of one token
  const dim3 pairs(unsigned(device_offset(rows.num_tokens, num_heads)));
  if (tensor_cores)
    launch_early(combine_splits_kernel<true>, pairs, dim3(kCombineThreads), 0, stream, p);
  else
    launch_early(combine_splits_kernel<false>, pairs, dim3(kCombineThreads), 0, stream, p);
}

}  // namespace jambo::backend::cuda
