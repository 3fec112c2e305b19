// The engine on the CUDA backend against the engine on the CPU backend: a few dozen greedy requests with
// continuous batching, chunked prefill, n = 2 forks and prompt logprobs give the same ids and logprobs
// within 1e-4; seeded sampled requests (temperature, top-k, top-p, min-p; tokens chosen on the GPU from the
// same draws as the CPU's) give the same ids but where logits 1e-5 apart put a draw on the other side of a
// token boundary.
#include "support/engine_test_util.h"
#include "cuda_test_util.h"

namespace jambo::testing {
namespace {

class CudaEngineTest : public GpuTest {};

Outputs run_engine(const model::Model& model, const std::vector<engine::RequestSpec>& specs,
                   engine::BackendKind backend) {
  engine::EngineOptions options = exact_engine_options(model, /*max_num_seqs=*/16, /*num_kv_blocks=*/16 * 8,
                                                       /*kv_block_size=*/8, /*max_model_len=*/64, backend);
  options.max_num_batched_tokens = 24;
  engine::Engine engine(model, nullptr, options);
  return run_to_end(engine, specs);
}

TEST_F(CudaEngineTest, GreedyRequestsMatchTheCpuEngine) {
  const model::Model model = load_fixture_model();
  std::vector<engine::RequestSpec> specs = random_workload(model, 40, /*seed=*/5, 30, /*allow_n=*/false);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].sampling.temperature = 0.0;  // greedy: the ids must agree
    specs[i].n = i % 5 == 2 ? 2 : 1;
  }
  const Outputs expected = run_engine(model, specs, engine::BackendKind::Cpu);
  const Outputs actual = run_engine(model, specs, engine::BackendKind::Cuda);
  ASSERT_EQ(expected.size(), actual.size());
  double worst = 0.0;
  for (const auto& [key, want] : expected) {
    ASSERT_TRUE(actual.count(key)) << key.first << " sample " << key.second;
    const engine::SampleOutput& got = actual.at(key);
    EXPECT_EQ(want.ids, got.ids) << key.first;
    ASSERT_EQ(want.logprobs.size(), got.logprobs.size()) << key.first;
    for (size_t i = 0; i < want.logprobs.size(); ++i)
      worst = std::max(worst, std::fabs(want.logprobs[i] - got.logprobs[i]));
    ASSERT_EQ(want.prompt_logprobs.size(), got.prompt_logprobs.size()) << key.first;
    for (size_t i = 0; i < want.prompt_logprobs.size(); ++i) {
      ASSERT_EQ(want.prompt_logprobs[i].has_value(), got.prompt_logprobs[i].has_value());
      if (want.prompt_logprobs[i])
        worst = std::max(worst, std::fabs(*want.prompt_logprobs[i] - *got.prompt_logprobs[i]));
    }
  }
  std::printf("[cuda engine vs cpu engine] max |dlogprob| = %.3g over %zu samples\n", worst, expected.size());
  EXPECT_LT(worst, 1e-4);
}

TEST_F(CudaEngineTest, SeededSamplingChoosesTheCpuEnginesTokens) {
  const model::Model model = load_fixture_model();
  std::vector<engine::RequestSpec> specs = random_workload(model, 40, /*seed=*/9, 30, /*allow_n=*/false);
  for (size_t i = 0; i < specs.size(); ++i) {
    engine::SamplingParams& sampling = specs[i].sampling;
    sampling.temperature = 0.6 + 0.1 * double(i % 7);
    sampling.seed = 1000 + i;
    sampling.top_k = i % 3 == 0 ? 20 : 0;
    sampling.top_p = i % 4 == 1 ? 0.9 : 1.0;
    specs[i].sampling.min_p = i % 5 == 3 ? 0.05 : 0.0;
    specs[i].n = i % 5 == 2 ? 2 : 1;
  }
  const Outputs expected = run_engine(model, specs, engine::BackendKind::Cpu);
  const Outputs actual = run_engine(model, specs, engine::BackendKind::Cuda);
  ASSERT_EQ(expected.size(), actual.size());
  size_t num_identical = 0;
  double worst = 0.0;
  for (const auto& [key, want] : expected) {
    ASSERT_TRUE(actual.count(key)) << key.first << " sample " << key.second;
    const engine::SampleOutput& got = actual.at(key);
    num_identical += want.ids == got.ids;
    // Up to and including the first differing token the two ran the same sequence: logprobs agree there.
    const size_t common = std::min(want.ids.size(), got.ids.size());
    size_t compared = 0;
    while (compared < common && want.ids[compared] == got.ids[compared]) ++compared;
    for (size_t i = 0; i < std::min(compared + 1, common); ++i)
      if (want.ids[i] == got.ids[i]) worst = std::max(worst, std::fabs(want.logprobs[i] - got.logprobs[i]));
  }
  std::printf("[cuda engine vs cpu engine, sampled] %zu of %zu samples identical, max |dlogprob| = %.3g\n",
              num_identical, expected.size(), worst);
  EXPECT_GE(double(num_identical), 0.9 * double(expected.size()));
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace jambo::testing
