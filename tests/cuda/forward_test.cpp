// The whole forward of the CUDA backend against the CPU backend, on every fixture checkpoint and every small
// random test model: the same steps (rows from zero state, one-token first chunks, continuing chunks, decodes,
// several rows per step) give logprobs within 1e-4 at every position; chunked prefill equals one-shot prefill.
#include "../backend/sequences.h"
#include "../backend/test_models.h"
#include "backend/cpu/cpu_backend.h"
#include "cuda_test_util.h"

#include <cstdio>

namespace jambo::testing {
namespace {

constexpr double kLogprobTolerance = 1e-4;  // f32 mode
constexpr int64_t kSequenceLength = 20;

// Four sequences over four steps; sequences 0 and 2 share their tokens (0 chunked 7 + 1 + 12, 2 in one shot).
// Returns every position's logits of every sequence.
std::vector<Logits> run_scenario(Backend& backend, int64_t vocab_size) {
  std::vector<int32_t> shared = random_tokens(kSequenceLength, vocab_size, 11);
  std::vector<Sequence> sequences = {Sequence(0, shared), Sequence(1, random_tokens(kSequenceLength, vocab_size, 12)),
                                     Sequence(2, shared), Sequence(3, random_tokens(kSequenceLength, vocab_size, 13))};
  std::vector<Logits> logits(sequences.size());
  auto at = [&](size_t i) { return &sequences[i]; };
  auto out = [&](size_t i) { return &logits[i]; };
  step(backend, {at(0), at(1), at(2)}, {7, 1, 20}, {out(0), out(1), out(2)});   // zero-state rows, one of one token
  step(backend, {at(0), at(1), at(3)}, {1, 5, 1}, {out(0), out(1), out(3)});    // decode, continuing, new one-token
  step(backend, {at(3), at(1), at(0)}, {19, 1, 12}, {out(3), out(1), out(0)});  // rows in another order
  step(backend, {at(1)}, {13}, {out(1)});
  return logits;
}

double max_difference(const std::vector<Logits>& a, const std::vector<Logits>& b) {
  double worst = 0.0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s].size(), b[s].size());
    for (size_t p = 0; p < std::min(a[s].size(), b[s].size()); ++p)
      worst = std::max(worst, max_logprob_difference(a[s][p], b[s][p]));
  }
  return worst;
}

void check_against_cpu(const Model& model, const std::string& name) {
  auto cpu = make_cpu_backend(model, test_cache(4));
  auto gpu = make_cuda_backend(model, test_cache(4));
  const std::vector<Logits> expected = run_scenario(*cpu, model.config.vocab_size);
  const std::vector<Logits> actual = run_scenario(*gpu, model.config.vocab_size);
  const double difference = max_difference(expected, actual);
  std::printf("[cuda vs cpu] %-28s max |dlogprob| = %.3g\n", name.c_str(), difference);
  ::testing::Test::RecordProperty("max_abs_dlogprob", std::to_string(difference));
  EXPECT_LT(difference, kLogprobTolerance) << name;
  // Chunked prefill (sequence 0) against one-shot prefill (sequence 2) of the same tokens, on the GPU.
  const double chunking = max_difference({actual[0]}, {actual[2]});
  EXPECT_LT(chunking, kLogprobTolerance) << name << ": chunked against one-shot prefill";
}

class FixtureForwardTest : public GpuParamTest<std::string> {};

TEST_P(FixtureForwardTest, MatchesCpuBackend) { check_against_cpu(load_fixture(GetParam()), GetParam()); }

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureForwardTest, ::testing::ValuesIn(fixture_model_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

class RandomModelForwardTest : public GpuParamTest<TestModelSpec> {};

TEST_P(RandomModelForwardTest, MatchesCpuBackend) {
  check_against_cpu(make_random_model(GetParam().config, GetParam().dtype, 42), GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(TestModels, RandomModelForwardTest, ::testing::ValuesIn(test_model_specs()), spec_name);

}  // namespace
}  // namespace jambo::testing
