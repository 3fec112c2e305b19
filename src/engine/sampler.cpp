#include "engine/sampler.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

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

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.0) return argmax(logits);

  // Candidates: the top_k most likely (ties: lower id), or all; sorted most likely first only where
  // top_k or top_p needs the order (sorting the whole vocabulary for every token is costly).
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (params_.top_k > 0 && size_t(params_.top_k) < ids.size()) {
    std::partial_sort(ids.begin(), ids.begin() + params_.top_k, ids.end(), more_likely);
    ids.resize(params_.top_k);
  } else if (params_.top_p < 1.0) {
    std::sort(ids.begin(), ids.end(), more_likely);
  }

  // Probabilities at this temperature, in double.
  std::vector<double> probs(ids.size());
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp((double(logits[ids[i]]) - max_logit) / params_.temperature);
    total += probs[i];
  }
  // Smallest prefix whose mass reaches top_p (always at least one token).
  size_t num_kept = ids.size();
  if (params_.top_p < 1.0) {
    double mass = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      mass += probs[i] / total;
      if (mass >= params_.top_p) {
        num_kept = i + 1;
        break;
      }
    }
  }
  const double kept_total = std::accumulate(probs.begin(), probs.begin() + num_kept, 0.0);
  double target = std::uniform_real_distribution<double>(0.0, kept_total)(rng_);
  for (size_t i = 0; i < num_kept; ++i) {
    target -= probs[i];
    if (target < 0.0) return ids[i];
  }
  return ids[num_kept - 1];
}

}  // namespace jambo
