// Requests of the prefix-caching tests on both backends (tests/engine/prefix_cache_test.cpp,
// tests/backend/cuda/engine_prefix_cache_test.cpp): prompts joined from shared pieces of random tokens, greedy or
// seeded sampled, with top logprobs, generating to their length.
#pragma once

#include "engine/request_spec.h"
#include "model/weights.h"
#include "support/sequences.h"

#include <string>
#include <vector>

namespace jambo::testing {

inline std::vector<int32_t> random_tokens(const model::Model& model, int64_t count, uint64_t seed) {
  return random_tokens(count, model.config.vocab_size, seed);
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Greedy for an even seed, sampled at temperature 0.8 for an odd one.
inline engine::RequestSpec prefix_request(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens,
                                          uint64_t seed = 7) {
  engine::RequestSpec spec;
  spec.id = id;
  spec.prompt_ids = std::move(prompt);
  spec.stop.max_tokens = max_tokens;
  spec.stop.ignore_eos = true;
  spec.sampling.temperature = seed % 2 ? 0.8 : 0.0;
  spec.sampling.seed = seed;
  spec.num_top_logprobs = 2;
  return spec;
}

}  // namespace jambo::testing
