// The engine's side of sampling: seeded draws, one per sampled token.
#include "engine/sampler.h"

#include "backend/logits_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace jambo::engine {
namespace {

// n draws of a seeded sampler, each chosen from the same logits.
std::vector<int32_t> sampled_tokens(SamplingParams params, std::span<const float> logits, int num_draws,
                                    double min_p = 0.0) {
  params.min_p = min_p;
  Sampler sampler(params, /*num_top_logprobs=*/0);
  std::vector<int32_t> tokens;
  for (int i = 0; i < num_draws; ++i) tokens.push_back(choose_token(logits, sampler.next_choice()).token);
  return tokens;
}

SamplingParams seeded(double temperature, uint64_t seed) {
  SamplingParams params;
  params.temperature = temperature;
  params.seed = seed;
  return params;
}

TEST(Sampler, SameSeedGivesSameSamples) {
  const std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f};
  EXPECT_EQ(sampled_tokens(seeded(1.0, 42), logits, 50), sampled_tokens(seeded(1.0, 42), logits, 50));
  EXPECT_NE(sampled_tokens(seeded(1.0, 42), logits, 50), sampled_tokens(seeded(1.0, 43), logits, 50));
}

TEST(Sampler, GreedyTakesNoDraw) {
  Sampler sampler(SamplingParams{}, /*num_top_logprobs=*/0);
  EXPECT_EQ(sampler.next_choice().uniform, 0.0);
  EXPECT_EQ(sampler.next_choice().temperature, 0.0);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int32_t, int> counts;
  const int num_draws = 20000;
  for (int32_t token : sampled_tokens(seeded(1.0, 7), logits, num_draws)) ++counts[token];
  EXPECT_NEAR(counts[0] / double(num_draws), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(num_draws), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(num_draws), 0.2, 0.02);
}

TEST(Sampler, TopKTopPAndMinPRestrictTheCandidates) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams top_k = seeded(1.0, 1);
  top_k.top_k = 2;
  SamplingParams top_p = seeded(1.0, 1);
  top_p.top_p = 0.7;  // 0.5 + 0.3 reaches it: tokens 0 and 1 only
  for (int32_t token : sampled_tokens(top_k, logits, 2000)) EXPECT_LT(token, 2);
  for (int32_t token : sampled_tokens(top_p, logits, 2000)) EXPECT_LT(token, 2);
  // min_p 0.5: p / p_max must reach 0.5, which 0.3 / 0.5 does and 0.15 / 0.5 does not.
  for (int32_t token : sampled_tokens(seeded(1.0, 1), logits, 2000, /*min_p=*/0.5)) EXPECT_LT(token, 2);
}

}  // namespace
}  // namespace jambo::engine
