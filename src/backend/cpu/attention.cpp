#include "backend/cpu/attention.h"

#include "backend/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace jambo::backend::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// The keys and values of one row in one attention layer, by position in the sequence.
struct RowKeysAndValues {
  KvCache& kv_cache;
  int64_t attention_layer;
  std::span<const int32_t> block_table;

  const float* key(int64_t position) const {  // [nkv, hd]
    return kv_cache.key(block_table[position / kv_cache.block_size()], attention_layer,
                        position % kv_cache.block_size());
  }
  const float* value(int64_t position) const {  // [nkv, hd]
    return kv_cache.value(block_table[position / kv_cache.block_size()], attention_layer,
                          position % kv_cache.block_size());
  }
};

// out = sum_j softmax_j(query · k_j * scale) v_j over positions j = 0..num_keys-1, in order.
void attend_one_query(const float* query,  // [hd]
                      const RowKeysAndValues& keys_and_values,
                      int64_t kv_offset,  // offset of the KV head within [nkv, hd]
                      int64_t num_keys, int64_t head_dim, float scale,
                      std::vector<float>& scores,  // scratch, [num_keys]
                      float* out) {                // [hd]
  scores.resize(size_t(num_keys));
  float max_score = -INFINITY;
  for (int64_t j = 0; j < num_keys; ++j) {
    scores[j] = dot(query, keys_and_values.key(j) + kv_offset, head_dim) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  float total = 0.0f;
  for (int64_t j = 0; j < num_keys; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    total += scores[j];
  }
  std::fill_n(out, head_dim, 0.0f);
  for (int64_t j = 0; j < num_keys; ++j) {
    const float probability = scores[j] / total;
    const float* value = keys_and_values.value(j) + kv_offset;
    for (int64_t d = 0; d < head_dim; ++d) out[d] += probability * value[d];
  }
}

// A token of the step: its row and its index within the row's tokens.
struct StepToken {
  const AttentionRow* row;
  int64_t index_in_row;
};

// Every query attends to its own position and the ones before it in its row, all queries of the
// step in one parallel loop. Query head h reads KV head h / (nh / nkv).
void attend(const model::JambaConfig& config, KvCache& kv_cache, int64_t attention_layer,
            const std::vector<StepToken>& tokens,  // [num_tokens]
            const Matrix& queries,                 // [num_tokens, nh*hd]
            Matrix& context) {                     // [num_tokens, nh*hd]
  const int64_t num_heads = config.num_attention_heads;
  const int64_t head_dim = config.head_dim;
  const int64_t heads_per_kv_head = num_heads / config.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(float(head_dim));
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 4)  // queries late in long rows cost more
    for (int64_t item = 0; item < int64_t(tokens.size()) * num_heads; ++item) {
      const int64_t token = item / num_heads;
      const int64_t head = item % num_heads;
      const AttentionRow& row = *tokens[token].row;
      const RowKeysAndValues keys_and_values{kv_cache, attention_layer, row.block_table};
      attend_one_query(queries.row(token) + element_offset(head, head_dim), keys_and_values,
                       element_offset(head / heads_per_kv_head, head_dim),
                       row.start_position + tokens[token].index_in_row + 1, head_dim, scale, scores,
                       context.row(token) + element_offset(head, head_dim));
    }
  }
}

}  // namespace

void store_keys_and_values(KvCache& kv_cache, int64_t attention_layer, const AttentionRow& row, const Matrix& keys,
                           const Matrix& values) {
  const int64_t width = keys.num_cols();
  for (int64_t t = 0; t < row.num_tokens; ++t) {
    const int64_t position = row.start_position + t;
    const int64_t block = row.block_table[position / kv_cache.block_size()];
    const int64_t slot_in_block = position % kv_cache.block_size();
    std::copy_n(keys.row(row.first_token + t), width, kv_cache.key(block, attention_layer, slot_in_block));
    std::copy_n(values.row(row.first_token + t), width, kv_cache.value(block, attention_layer, slot_in_block));
  }
}

void attention_mixer(const model::AttentionWeights& weights, const model::JambaConfig& config, KvCache& kv_cache,
                     int64_t attention_layer, const Matrix& x, std::span<const AttentionRow> rows, Matrix& out) {
  // Kept from call to call (per thread) to reuse their storage; only this thread names them.
  thread_local Matrix queries, keys, values, context;
  matmul(x, weights.q_proj, queries);
  matmul(x, weights.k_proj, keys);
  matmul(x, weights.v_proj, values);
  std::vector<StepToken> tokens(size_t(x.num_rows()));
  for (const AttentionRow& row : rows) {
    store_keys_and_values(kv_cache, attention_layer, row, keys, values);
    for (int64_t t = 0; t < row.num_tokens; ++t) tokens[size_t(row.first_token + t)] = {&row, t};
  }
  context.resize(x.num_rows(), queries.num_cols());
  attend(config, kv_cache, attention_layer, tokens, queries, context);
  matmul(context, weights.o_proj, out);
}

}  // namespace jambo::backend::cpu
