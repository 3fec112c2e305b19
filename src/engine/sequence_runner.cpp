#include "engine/sequence_runner.h"

#include "core/error.h"

#include <algorithm>
#include <numeric>

namespace jambo {

CacheConfig single_sequence_cache(int64_t max_tokens) {
  CacheConfig cache;
  cache.num_state_slots = 1;
  cache.num_kv_blocks = std::max<int64_t>(1, (max_tokens + cache.kv_block_size - 1) / cache.kv_block_size);
  return cache;
}

SequenceRunner::SequenceRunner(Backend& backend, const CacheConfig& cache, int64_t max_chunk_tokens)
    : backend_(backend), cache_(cache), max_chunk_tokens_(max_chunk_tokens), block_table_(cache.num_kv_blocks) {
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

const StepLogits& SequenceRunner::step(std::span<const int32_t> sequence, int64_t first, int64_t count,
                                       bool all_logits) {
  const int64_t num_blocks = (first + count + cache_.kv_block_size - 1) / cache_.kv_block_size;
  JAMBO_ASSERT(num_blocks <= int64_t(block_table_.size()));
  BatchRow row;
  row.request_id = 0;
  row.tokens = sequence.subspan(first, count);
  row.start_position = first;
  row.has_initial_state = first > 0;  // law 1: the phase comes from the state, not the token count
  row.slot = 0;
  row.block_table = std::span<const int32_t>(block_table_).first(num_blocks);
  row.all_logits = all_logits;
  backend_.forward(std::span<const BatchRow>(&row, 1), logits_);
  return logits_;
}

ScoredSequence SequenceRunner::score(std::span<const int32_t> tokens, int64_t num_top_logprobs) {
  const int64_t num_tokens = int64_t(tokens.size());
  JAMBO_REQUIRE(num_tokens <= max_sequence_length(), "sequence of {} tokens is longer than the maximum of {}",
                num_tokens, max_sequence_length());
  ScoredSequence out;
  out.logprobs.assign(num_tokens, std::nullopt);
  out.top_logprobs.resize(num_tokens);
  const int64_t chunk = max_chunk_tokens_ > 0 ? max_chunk_tokens_ : std::max<int64_t>(num_tokens, 1);
  for (int64_t first = 0; first < num_tokens; first += chunk) {
    const int64_t count = std::min(chunk, num_tokens - first);
    const StepLogits& logits = step(tokens, first, count, /*all_logits=*/true);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t predicted = first + i + 1;  // the logits at position p predict token p + 1
      if (predicted >= num_tokens) break;
      const std::span<const float> vector = logits.row(0, i);
      const int32_t token = tokens[predicted];
      out.logprobs[predicted] = double(vector[token]) - log_sum_exp(vector);
      out.top_logprobs[predicted] = top_logprobs(vector, num_top_logprobs);
    }
  }
  return out;
}

GenerationResult SequenceRunner::generate(std::span<const int32_t> prompt, const SamplingParams& params,
                                          const std::function<void(int32_t)>& on_token) {
  params.validate();
  JAMBO_REQUIRE(!prompt.empty(), "the prompt is empty: give at least one token");
  const int64_t num_prompt = int64_t(prompt.size());
  JAMBO_REQUIRE(params.max_tokens <= max_sequence_length() - num_prompt,
                "prompt of {} tokens plus max_tokens {} exceeds the maximum sequence length {}", num_prompt,
                params.max_tokens, max_sequence_length());
  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  GenerationResult out;
  out.finish_reason = "length";
  if (params.max_tokens == 0) return out;

  const int64_t chunk = max_chunk_tokens_ > 0 ? max_chunk_tokens_ : num_prompt;
  const StepLogits* logits = nullptr;
  for (int64_t first = 0; first < num_prompt; first += chunk)
    logits = &step(sequence, first, std::min(chunk, num_prompt - first), /*all_logits=*/false);

  Sampler sampler(params);
  const JambaConfig& config = backend_.config();
  while (true) {
    const std::span<const float> vector = logits->row(0);
    const int32_t token = sampler.sample(vector);
    out.ids.push_back(token);
    out.logprobs.push_back(double(vector[token]) - log_sum_exp(vector));
    out.top_logprobs.push_back(top_logprobs(vector, params.num_top_logprobs));
    if (on_token) on_token(token);
    if (!params.ignore_eos && config.is_eos(token)) {
      out.finish_reason = "stop";
      break;
    }
    if (int64_t(out.ids.size()) == params.max_tokens) break;
    sequence.push_back(token);
    logits = &step(sequence, int64_t(sequence.size()) - 1, 1, /*all_logits=*/false);
  }
  return out;
}

}  // namespace jambo
