// Drives the backend the way an engine would: each sequence owns a state slot and a range of KV
// blocks, and steps feed chunks of its tokens as rows; and the logprob comparisons of the tests.
#pragma once

#include "backend/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace jambo::testing {

constexpr int64_t kMaxBlocksPerSequence = 16;
constexpr int64_t kBlockSize = 4;  // small, so that sequences span several blocks

inline backend::CacheConfig test_cache(int64_t num_sequences) {
  return backend::CacheConfig{num_sequences, num_sequences * kMaxBlocksPerSequence, kBlockSize};
}

using Logits = std::vector<std::vector<float>>;  // [num_positions][V]

struct Sequence {
  int64_t request_id = 0;
  int64_t slot = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> block_table;  // [kMaxBlocksPerSequence]
  int64_t num_computed = 0;          // tokens already folded into the state

  // Sequence i uses slot i and blocks [i * kMaxBlocksPerSequence, (i + 1) * kMaxBlocksPerSequence).
  Sequence(int64_t index, std::vector<int32_t> sequence_tokens)
      : request_id(100 + index), slot(index), tokens(std::move(sequence_tokens)) {
    block_table.resize(kMaxBlocksPerSequence);
    std::iota(block_table.begin(), block_table.end(), int32_t(index * kMaxBlocksPerSequence));
  }

  backend::BatchRow row(int64_t num_tokens, backend::LogitsCopy copy) const {
    backend::BatchRow out;
    out.sequence_id = request_id;
    out.tokens = std::span<const int32_t>(tokens).subspan(size_t(num_computed), size_t(num_tokens));
    out.start_position = num_computed;
    out.has_initial_state = num_computed > 0;
    out.slot = slot;
    out.block_table = block_table;
    out.copy_logits = copy;
    return out;
  }
};

inline std::vector<int32_t> random_tokens(int64_t count, int64_t vocab_size, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < count; ++i) tokens.push_back(int32_t(random() % uint64_t(vocab_size)));
  return tokens;
}

// Runs one step where sequences[i] feeds num_tokens[i] tokens with logits for all of them;
// appends each sequence's logits to outputs[i] (when given and not null).
inline void step(backend::Backend& backend, std::vector<Sequence*> sequences, std::vector<int64_t> num_tokens,
                 std::vector<Logits*> outputs = {}) {
  std::vector<backend::BatchRow> rows;
  for (size_t i = 0; i < sequences.size(); ++i)
    rows.push_back(sequences[i]->row(num_tokens[i], backend::LogitsCopy::All));
  backend::StepOutput output;
  backend.forward(rows, output);
  for (size_t i = 0; i < sequences.size(); ++i) {
    sequences[i]->num_computed += num_tokens[i];
    if (outputs.empty() || outputs[i] == nullptr) continue;
    for (int64_t t = 0; t < num_tokens[i]; ++t) {
      const std::span<const float> vector = output.logits(int64_t(i), t);
      outputs[i]->emplace_back(vector.begin(), vector.end());
    }
  }
}

// Feeds the whole sequence alone in chunks of the given sizes; returns every position's logits.
inline Logits run_in_chunks(backend::Backend& backend, Sequence sequence, const std::vector<int64_t>& chunk_sizes) {
  Logits logits;
  for (int64_t size : chunk_sizes) step(backend, {&sequence}, {size}, {&logits});
  EXPECT_EQ(sequence.num_computed, int64_t(sequence.tokens.size()));
  return logits;
}

// A random split of `total` tokens into chunks of 1 to max_chunk tokens.
inline std::vector<int64_t> random_chunking(int64_t total, int64_t max_chunk, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<int64_t> sizes;
  for (int64_t done = 0; done < total;) {
    sizes.push_back(std::min(total - done, int64_t(1 + random() % uint64_t(max_chunk))));
    done += sizes.back();
  }
  return sizes;
}

// log softmax in double.
inline std::vector<double> log_softmax(std::span<const float> logits) {
  double max_logit = -INFINITY;
  for (float v : logits) max_logit = std::max(max_logit, double(v));
  double total = 0.0;
  for (float v : logits) total += std::exp(double(v) - max_logit);
  std::vector<double> out;
  for (float v : logits) out.push_back(double(v) - max_logit - std::log(total));
  return out;
}

// max over entries of |log_softmax(a) - log_softmax(b)|; infinity when any is not finite.
inline double max_logprob_difference(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  const std::vector<double> la = log_softmax(a), lb = log_softmax(b);
  double worst = 0.0;
  for (size_t i = 0; i < la.size(); ++i) {
    const double difference = std::fabs(la[i] - lb[i]);
    if (!std::isfinite(difference)) return INFINITY;
    worst = std::max(worst, difference);
  }
  return worst;
}

}  // namespace jambo::testing
