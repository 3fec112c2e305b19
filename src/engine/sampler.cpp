#include "engine/sampler.h"

#include "core/error.h"

#include <cmath>

namespace jambo {

void SamplingParams::validate() const {
  JAMBO_REQUIRE(std::isfinite(temperature) && temperature >= 0.0,
                "temperature must be >= 0, got {}", temperature);
  JAMBO_REQUIRE(top_k >= 0, "top_k must be >= 0, got {}", top_k);
  JAMBO_REQUIRE(top_p > 0.0 && top_p <= 1.0, "top_p must be in (0, 1], got {}", top_p);
  JAMBO_REQUIRE(max_tokens >= 0, "max_tokens must be >= 0, got {}", max_tokens);
  JAMBO_REQUIRE(num_top_logprobs >= 0 && num_top_logprobs <= 20,
                "logprobs must be between 0 and 20, got {}", num_top_logprobs);
}

Sampler::Sampler(const SamplingParams& params, double min_p)
    : params_(params), min_p_(min_p), rng_(params.seed ? *params.seed : std::random_device{}()) {}

TokenChoice Sampler::next_choice() {
  TokenChoice choice;
  choice.temperature = params_.temperature;
  choice.top_k = params_.top_k;
  choice.top_p = params_.top_p;
  choice.min_p = min_p_;
  choice.num_top_logprobs = params_.num_top_logprobs;
  if (params_.temperature > 0.0) choice.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return choice;
}

}  // namespace jambo
