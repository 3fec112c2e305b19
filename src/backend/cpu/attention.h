// The attention mixer (spec §3.4): causal, GQA/MQA, no positional encoding, keys from the paged
// KV cache.
#pragma once

#include "backend/cpu/matrix.h"
#include "backend/cpu/state_memory.h"
#include "model/config.h"
#include "model/weights.h"

#include <span>

namespace jambo::backend::cpu {

// One row's share of an attention layer.
struct AttentionRow {
  int64_t first_token = 0;  // index of the row's first token in the step's activations
  int64_t num_tokens = 0;
  int64_t start_position = 0;            // position of the row's first token in its sequence
  std::span<const int32_t> block_table;  // [>= ceil((start_position + num_tokens) / block_size)]
};

// kv_cache[block of position p][attention_layer][key|value][p % block_size] = keys|values[t] for the row's tokens t
// at positions p = start_position + t (the CUDA store_keys_and_values' twin).
void store_keys_and_values(KvCache& kv_cache, int64_t attention_layer, const AttentionRow& row,
                           const Matrix& keys,     // [num_tokens of the step, nkv*hd]
                           const Matrix& values);  // [num_tokens of the step, nkv*hd]

// Writes this step's keys and values into each row's blocks, then out = attention(x) where the
// token at position p attends to positions 0..p of its own row, in order.
void attention_mixer(const model::AttentionWeights& weights, const model::JambaConfig& config, KvCache& kv_cache,
                     int64_t attention_layer,  // index among the attention layers
                     const Matrix& x,          // [num_tokens, H] (already normalized)
                     std::span<const AttentionRow> rows,
                     Matrix& out);  // [num_tokens, H]

}  // namespace jambo::backend::cpu
