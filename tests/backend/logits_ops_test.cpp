// The host logits ops: log-softmax, top-K and the token choice (the CPU twin of the CUDA logits kernels).
#include "backend/logits_ops.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>

namespace jambo::backend {
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

TEST(ChooseToken, TemperatureZeroIsGreedyWithTiesToTheLowerId) {
  EXPECT_EQ(choose_token(std::vector<float>{0.1f, 3.0f, 2.9f}, TokenChoice{}).token, 1);
  EXPECT_EQ(choose_token(std::vector<float>{3.0f, 1.0f, 3.0f}, TokenChoice{}).token, 0);
}

TEST(ChooseToken, ReportsTheUnmodifiedLogprobAndTopK) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  TokenChoice choice;
  choice.temperature = 0.5;
  choice.top_k = 1;
  choice.uniform = 0.9;
  choice.num_top_logprobs = 2;
  const ChosenToken chosen = choose_token(logits, choice);
  EXPECT_EQ(chosen.token, 0);
  EXPECT_NEAR(chosen.logprob, std::log(0.5), 1e-6);  // not the logprob at temperature 0.5 nor after top_k
  ASSERT_EQ(chosen.top_logprobs.size(), 2u);
  EXPECT_EQ(chosen.top_logprobs[1].token, 1);
}

TEST(ChooseToken, TheDrawWalksTheCumulativeMass) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  TokenChoice choice;
  choice.temperature = 1.0;
  for (const auto& [uniform, token] : std::vector<std::pair<double, int32_t>>{{0.0, 0}, {0.49, 0}, {0.51, 1},
                                                                              {0.79, 1}, {0.81, 2}, {0.999, 2}}) {
    choice.uniform = uniform;
    EXPECT_EQ(choose_token(logits, choice).token, token) << "uniform " << uniform;
  }
}

TEST(ChooseToken, OutOfRangeChoicesAreRejectedByName) {
  TokenChoice choice;
  choice.uniform = 1.0;
  EXPECT_THROW(validate_choice(choice), Error);
  choice.uniform = 0.5;
  choice.min_p = 2.0;
  try {
    validate_choice(choice);
    FAIL() << "min_p 2 accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("min_p"), std::string::npos);
  }
}

}  // namespace
}  // namespace jambo::backend
