#include "backend/cpu/attention.h"

#include "backend/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace jambo::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void store_keys_and_values(KvCache& kv_cache, int64_t attention_layer, const AttentionRow& row,
                           const Matrix& keys,     // [num_tokens, nkv*hd]
                           const Matrix& values) {  // [num_tokens, nkv*hd]
  const int64_t width = keys.num_cols();
  for (int64_t t = 0; t < row.num_tokens; ++t) {
    const int64_t position = row.start_position + t;
    const int64_t block = row.block_table[position / kv_cache.block_size()];
    const int64_t slot_in_block = position % kv_cache.block_size();
    std::copy_n(keys.row(row.first_token + t), width, kv_cache.key(block, attention_layer, slot_in_block));
    std::copy_n(values.row(row.first_token + t), width, kv_cache.value(block, attention_layer, slot_in_block));
  }
}

// context[t, head] = sum_j softmax_j(q · k_j * hd^-0.5) v_j over the row's positions j <= p(t).
void attend(const JambaConfig& config, KvCache& kv_cache, int64_t attention_layer, const AttentionRow& row,
            const Matrix& queries,  // [num_tokens, nh*hd]
            Matrix& context) {      // [num_tokens, nh*hd]
  const int64_t num_heads = config.num_attention_heads;
  const int64_t head_dim = config.head_dim;
  const int64_t heads_per_kv_head = num_heads / config.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const int64_t block_size = kv_cache.block_size();
#pragma omp parallel
  {
    std::vector<float> weights;  // [num_keys] attention weights of one query
#pragma omp for schedule(static)
    for (int64_t item = 0; item < row.num_tokens * num_heads; ++item) {
      const int64_t t = item / num_heads;
      const int64_t head = item % num_heads;
      const int64_t kv_offset = element_offset(head / heads_per_kv_head, head_dim);
      const int64_t num_keys = row.start_position + t + 1;
      const float* query = queries.row(row.first_token + t) + element_offset(head, head_dim);
      auto key_at = [&](int64_t j) {
        return kv_cache.key(row.block_table[j / block_size], attention_layer, j % block_size) + kv_offset;
      };
      auto value_at = [&](int64_t j) {
        return kv_cache.value(row.block_table[j / block_size], attention_layer, j % block_size) + kv_offset;
      };

      weights.resize(size_t(num_keys));
      float max_score = -INFINITY;
      for (int64_t j = 0; j < num_keys; ++j) {
        weights[j] = dot(query, key_at(j), head_dim) * scale;
        max_score = std::max(max_score, weights[j]);
      }
      float total = 0.0f;
      for (int64_t j = 0; j < num_keys; ++j) {
        weights[j] = std::exp(weights[j] - max_score);
        total += weights[j];
      }
      float* out = context.row(row.first_token + t) + element_offset(head, head_dim);
      std::fill_n(out, head_dim, 0.0f);
      for (int64_t j = 0; j < num_keys; ++j) {
        const float weight = weights[j] / total;
        const float* value = value_at(j);
        for (int64_t d = 0; d < head_dim; ++d) out[d] += weight * value[d];
      }
    }
  }
}

}  // namespace

void attention_mixer(const AttentionWeights& weights, const JambaConfig& config, KvCache& kv_cache,
                     int64_t attention_layer, const Matrix& x, std::span<const AttentionRow> rows, Matrix& out) {
  Matrix queries, keys, values;
  matmul(x, weights.q_proj, queries);
  matmul(x, weights.k_proj, keys);
  matmul(x, weights.v_proj, values);
  Matrix context(x.num_rows(), queries.num_cols());
  for (const AttentionRow& row : rows) {
    store_keys_and_values(kv_cache, attention_layer, row, keys, values);
    attend(config, kv_cache, attention_layer, row, queries, context);
  }
  matmul(context, weights.o_proj, out);
}

}  // namespace jambo::cpu
