// Scores one sequence at a time through a backend, in slot 0 and KV blocks 0..n-1: the plain scoring reference
// behind `jambo score` and the tests' oracle (`jambo compare` re-scores many samples per step through
// forensics/reference_scorer, bitwise the same on the CPU backend). Generation runs through the engine only.
#pragma once

#include "backend/backend.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jambo::forensics {

struct ScoredSequence {
  std::vector<std::optional<double>> logprobs;          // [T]; position 0 has none
  std::vector<std::vector<backend::TokenLogprob>> top_logprobs;  // [T] each [K]; position 0 empty
};

// The cache of the reference path: one state slot and KV blocks for max_tokens tokens (at least one block).
backend::CacheConfig single_sequence_cache(int64_t max_tokens);

class SequenceRunner {
 public:
  // The backend must have at least one state slot and num_kv_blocks blocks of kv_block_size.
  // max_chunk_tokens bounds the tokens of one prefill step (0: the whole prompt at once).
  SequenceRunner(backend::Backend& backend, const backend::CacheConfig& cache, int64_t max_chunk_tokens = 0);

  int64_t max_sequence_length() const { return cache_.num_kv_blocks * cache_.kv_block_size; }

  // Throws backend::NonFiniteLogits when the logits of a chunk are not finite, naming the sequence by `name` and
  // the chunk's tokens.
  ScoredSequence score(std::span<const int32_t> tokens, int64_t num_top_logprobs, std::string_view name);

 private:
  backend::Backend& backend_;
  backend::CacheConfig cache_;
  int64_t max_chunk_tokens_;
  std::vector<int32_t> block_table_;  // [num_kv_blocks] identity: logical block i is physical block i
  backend::StepOutput output_;
};

}  // namespace jambo::forensics
