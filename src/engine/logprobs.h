// Log-probabilities of a logits vector: log-softmax in double precision and the top-K entries.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace jambo {

struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0.0;
};

// log(sum(exp(logits))) computed in double with the max subtracted first.
double log_sum_exp(std::span<const float> logits);

// The K most likely tokens, most likely first; ties go to the lower id (like a stable sort).
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int64_t k);

}  // namespace jambo
