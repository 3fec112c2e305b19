#include "engine/sampler.h"

namespace jambo::engine {

Sampler::Sampler(const SamplingParams& params, int64_t num_top_logprobs)
    : params_(params), num_top_logprobs_(num_top_logprobs), rng_(params.seed ? *params.seed : std::random_device{}()) {}

backend::TokenChoice Sampler::next_choice() {
  backend::TokenChoice choice;
  choice.temperature = params_.temperature;
  choice.top_k = params_.top_k;
  choice.top_p = params_.top_p;
  choice.min_p = params_.min_p;
  choice.num_top_logprobs = num_top_logprobs_;
  if (params_.temperature > 0.0) choice.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return choice;
}

}  // namespace jambo::engine
