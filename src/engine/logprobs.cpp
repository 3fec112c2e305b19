#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>

namespace jambo {

double log_sum_exp(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(double(logit) - double(max_logit));
  return double(max_logit) + std::log(sum);
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int64_t k) {
  k = std::min<int64_t>(k, int64_t(logits.size()));
  if (k <= 0) return {};
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
  const double normalizer = log_sum_exp(logits);
  std::vector<TokenLogprob> out(k);
  for (int64_t i = 0; i < k; ++i) out[i] = {ids[i], double(logits[ids[i]]) - normalizer};
  return out;
}

}  // namespace jambo
