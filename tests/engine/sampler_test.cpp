#include "engine/logprobs.h"
#include "engine/sampler.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace jambo {
namespace {

TEST(Logprobs, LogSumExpIsStableForLargeLogits) {
  const std::vector<float> logits = {1000.0f, 1000.0f};
  EXPECT_NEAR(log_sum_exp(logits), 1000.0 + std::log(2.0), 1e-9);
}

TEST(Logprobs, TopLogprobsAreSortedNormalizedAndBreakTiesByLowerId) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  const auto top = top_logprobs(logits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_EQ(top[1].token, 2);
  EXPECT_EQ(top[2].token, 0);
  double total = 0.0;
  for (float logit : logits) total += std::exp(double(logit));
  EXPECT_NEAR(top[0].logprob, 2.0 - std::log(total), 1e-12);
  EXPECT_EQ(top_logprobs(logits, 10).size(), 4u);
  EXPECT_TRUE(top_logprobs(logits, 0).empty());
}

TEST(Sampler, TemperatureZeroIsGreedy) {
  Sampler sampler(SamplingParams{});
  EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 3.0f, 2.9f}), 1);
}

TEST(Sampler, SameSeedGivesSameSamples) {
  SamplingParams params;
  params.temperature = 1.0;
  params.seed = 42;
  const std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f};
  Sampler a(params), b(params);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  SamplingParams params;
  params.temperature = 1.0;
  params.seed = 7;
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler sampler(params);
  std::map<int32_t, int> counts;
  const int num_draws = 20000;
  for (int i = 0; i < num_draws; ++i) ++counts[sampler.sample(logits)];
  EXPECT_NEAR(counts[0] / double(num_draws), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(num_draws), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(num_draws), 0.2, 0.02);
}

TEST(Sampler, TopKAndTopPRestrictTheCandidates) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams top_k;
  top_k.temperature = 1.0;
  top_k.top_k = 2;
  top_k.seed = 1;
  SamplingParams top_p = top_k;
  top_p.top_k = 0;
  top_p.top_p = 0.7;  // 0.5 + 0.3 reaches it: tokens 0 and 1 only
  Sampler by_k(top_k), by_p(top_p);
  for (int i = 0; i < 2000; ++i) {
    EXPECT_LT(by_k.sample(logits), 2);
    EXPECT_LT(by_p.sample(logits), 2);
  }
}

TEST(Sampler, OutOfRangeParametersAreRejectedByName) {
  SamplingParams params;
  params.top_p = 1.5;
  try {
    params.validate();
    FAIL() << "top_p 1.5 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("top_p"), std::string::npos);
  }
  params.top_p = 1.0;
  params.temperature = -1.0;
  EXPECT_THROW(params.validate(), Error);
}

}  // namespace
}  // namespace jambo
