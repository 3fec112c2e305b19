#include "forensics/sequence_runner.h"

#include "backend/nonfinite_logits.h"
#include "core/error.h"

#include <algorithm>
#include <numeric>

namespace jambo::forensics {

backend::CacheConfig single_sequence_cache(int64_t max_tokens) {
  backend::CacheConfig cache;
  cache.num_state_slots = 1;
  cache.num_kv_blocks = std::max<int64_t>(1, backend::kv_blocks_for(max_tokens, cache.kv_block_size));
  return cache;
}

SequenceRunner::SequenceRunner(backend::Backend& backend, const backend::CacheConfig& cache, int64_t max_chunk_tokens)
    : backend_(backend), cache_(cache), max_chunk_tokens_(max_chunk_tokens), block_table_(cache.num_kv_blocks) {
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

ScoredSequence SequenceRunner::score(std::span<const int32_t> tokens, int64_t num_top_logprobs, std::string_view name) {
  const int64_t num_tokens = int64_t(tokens.size());
  JAMBO_REQUIRE(num_tokens <= max_sequence_length(), "sequence of {} tokens is longer than the maximum of {}",
                num_tokens, max_sequence_length());
  ScoredSequence out;
  out.logprobs.assign(size_t(num_tokens), std::nullopt);
  out.top_logprobs.resize(size_t(num_tokens));
  const int64_t chunk = max_chunk_tokens_ > 0 ? max_chunk_tokens_ : std::max<int64_t>(num_tokens, 1);
  for (int64_t first = 0; first < num_tokens; first += chunk) {
    const int64_t count = std::min(chunk, num_tokens - first);
    backend::BatchRow row =
        backend::sequence_row(/*sequence_id=*/0, tokens, first, count, /*slot=*/0, block_table_, cache_.kv_block_size);
    // The logits at position p predict token p + 1: the chunk's targets are the tokens after each of its own.
    row.targets = tokens.subspan(size_t(first + 1), size_t(std::min(count, num_tokens - first - 1)));
    row.num_top_logprobs = num_top_logprobs;
    backend_.forward(std::span<const backend::BatchRow>(&row, 1), output_);
    backend::require_finite_logits(
        output_, [&](size_t) { return fmt::format("{}, tokens {} to {}", name, first, first + count - 1); });
    const backend::RowOutput& scored = output_.rows[0];
    for (size_t i = 0; i < row.targets.size(); ++i) {
      out.logprobs[first + i + 1] = scored.target_logprobs[i];
      if (num_top_logprobs > 0) out.top_logprobs[first + i + 1] = scored.target_top_logprobs[i];
    }
  }
  return out;
}

}  // namespace jambo::forensics
