// The attention mixer's kernels (spec §3.4): this step's keys and values written into each row's paged KV
// blocks, then causal attention over the block tables, GQA and MQA (query head h reads KV head
// h / (nh / nkv)), no positional encoding. One launch each for all rows of a step, prefill and decode alike.
#pragma once

#include "backend/cuda/device_rows.h"

namespace jambo::backend::cuda {

// Where one attention layer's keys and values lie in the paged pool
// [num_blocks, num_attention_layers, 2 (key, value), block_size, nkv, hd].
struct KvLayout {
  int64_t block_size = 0;    // tokens per block
  int64_t num_kv_heads = 0;  // nkv
  int64_t head_dim = 0;      // hd
  int64_t block_stride = 0;  // elements of one block (all attention layers)
  int64_t layer_offset = 0;  // elements from a block's start to this layer's keys; its values follow them

  JAMBO_HOST_DEVICE int64_t token_stride() const { return num_kv_heads * head_dim; }
  JAMBO_HOST_DEVICE int64_t half_stride() const { return block_size * token_stride(); }
};

// kv_pool[block of position p][layer][key|value][p % block_size] = keys|values[t] for every step token t at
// position p = start_position + its index in the row.
void store_keys_and_values(const DeviceRows& rows, const KvLayout& layout,
                           const float* keys,    // [T, nkv*hd]
                           const float* values,  // [T, nkv*hd]
                           float* kv_pool,       // [num_blocks, block_stride]
                           cudaStream_t stream);

// Whether paged_attention runs on the tensor cores, prefill and decode rows alike: in the 16-bit mode, for a head
// dimension that is a multiple of 16 up to 128, with up to 64 query heads per KV head.
bool attention_runs_on_tensor_cores(const KvLayout& layout, int64_t num_heads, bool sixteen_bit);

// The floats of `partial` that paged_attention needs for these rows: [rows.num_splits, nh, hd + 2].
int64_t attention_partial_size(const DeviceRows& rows, const KvLayout& layout, int64_t num_heads);

// context[t, head] = sum_j softmax_j(q · k_j / sqrt(hd)) v_j over positions j = 0 .. p of the token's row.
// Invariant (docs/DESIGN.md, "GPU invariance"): a query's keys are cut into splits of kAttentionSplitKeys positions
// from position 0, each split summed a tile at a time in position order with the online softmax, and the splits'
// results folded in order by one function (fold_factors). Only the key positions set that schedule: a query has the
// same bits in a prefill and in a decode step, beside any rows. A prefill's kernel folds its query's splits itself;
// a decode step gives a token's splits to several blocks (how many depends on the number of tokens alone, so that
// a decode step's launches stay the same from step to step: step_graphs.h), which leave them in `partial` for one
// more launch to fold. fp32 kernel: one block per (token, KV head, worker) for the query heads sharing it.
// sixteen_bit (the bf16 mode): on the tensor cores instead (where attention_runs_on_tensor_cores says so), queries,
// keys and values rounded to bf16, fp32 accumulation and softmax.
void paged_attention(const DeviceRows& rows, const KvLayout& layout, int64_t num_heads,
                     const float* queries,  // [T, nh*hd]
                     const float* kv_pool,  // [num_blocks, block_stride]
                     float* context,        // [T, nh*hd]
                     DeviceBuffer<float>& partial,  // grown on demand: attention_partial_size
                     bool sixteen_bit, cudaStream_t stream);

}  // namespace jambo::backend::cuda
