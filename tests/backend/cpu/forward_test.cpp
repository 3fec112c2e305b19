// The whole forward against the independent double-precision reference, on every test model.
#include "backend/cpu/cpu_backend.h"
#include "naive_reference.h"
#include "support/sequences.h"
#include "support/test_models.h"

#include <gtest/gtest.h>

#include <cmath>

namespace jambo::backend::cpu {
namespace {

using testing::Sequence;

class ForwardTest : public ::testing::TestWithParam<testing::TestModelSpec> {};

TEST_P(ForwardTest, EveryPositionMatchesNaiveReference) {
  const model::Model model = make_random_model(GetParam().config, GetParam().dtype, 42);
  const std::vector<int32_t> tokens = testing::random_tokens(23, model.config.vocab_size, 5);
  auto backend = make_cpu_backend(model, testing::test_cache(1));
  const testing::Logits logits = testing::run_in_chunks(*backend, Sequence(0, tokens), {23});
  const naive::Rows expected = naive::forward(model, tokens);

  double max_error = 0.0, max_magnitude = 0.0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (size_t v = 0; v < expected[t].size(); ++v) {
      max_error = std::max(max_error, std::fabs(logits[t][v] - expected[t][v]));
      max_magnitude = std::max(max_magnitude, std::fabs(expected[t][v]));
    }
  }
  // fp32 against double: errors of a few ulps per op, far below the spread of the logits.
  EXPECT_GT(max_magnitude, 1.0) << "logits should not be near uniform";
  EXPECT_LT(max_error, 1e-5 * max_magnitude) << "max |logit error| " << max_error << " of max |logit| "
                                             << max_magnitude;
}

INSTANTIATE_TEST_SUITE_P(TestModels, ForwardTest, ::testing::ValuesIn(testing::test_model_specs()),
                         testing::spec_name);

}  // namespace
}  // namespace jambo::backend::cpu
