// return_routed_experts on the CUDA backend (bf16 weights, the invariant kernels, decode graphs): each token's
// routing is its own, the same alone as among 63 other requests under a budget of 32 tokens, and a prefill of the
// whole sequence routes it alike; and the same experts as the CPU backend's in the f32 mode, where the router's
// logits are within 1e-4 of the CPU's.
#include "support/engine_test_util.h"
#include "cuda_test_util.h"

namespace jambo::testing {
namespace {

class CudaRoutedExpertsTest : public GpuTest {
 protected:
  Outputs run(const std::vector<engine::RequestSpec>& specs, int64_t max_num_seqs, int64_t max_num_batched_tokens,
              engine::BackendKind backend = engine::BackendKind::Cuda,
              engine::CudaWeights weights = engine::CudaWeights::Bf16) const {
    engine::EngineOptions options = exact_engine_options(model_, max_num_seqs, 64 * 8, 8, 64, backend);
    options.backend.cuda_weights = weights;
    options.memory_budget = {.bytes = engine::exact_memory_budget(
                                 model_.config, engine::backend_weight_bytes(backend, model_, weights),
                                 max_num_seqs, 64 * 8, 8, DType::F32)};
    options.max_num_batched_tokens = max_num_batched_tokens;
    engine::Engine engine(model_, nullptr, options);
    return run_to_end(engine, specs);
  }
  std::vector<engine::RequestSpec> workload(int64_t count) const {
    std::vector<engine::RequestSpec> specs = random_workload(model_, count, /*seed=*/11, 30);
    for (engine::RequestSpec& spec : specs) spec.return_routed_experts = true;
    return specs;
  }

  model::Model model_ = load_fixture_model();  // 4 MoE layers of 4 experts, top-2
};

TEST_F(CudaRoutedExpertsTest, ARequestsRoutingIsItsOwnAndAReplayRoutesItAlike) {
  const std::vector<engine::RequestSpec> specs = workload(64);
  Outputs alone;
  for (const engine::RequestSpec& spec : specs) alone.merge(run({spec}, spec.n, 64));
  const Outputs mixed = run(specs, 64, 32);
  std::vector<engine::RequestSpec> replays;
  for (const auto& [key, sample] : alone) {
    EXPECT_EQ(sample.prompt_routed_experts, mixed.at(key).prompt_routed_experts) << key.first;
    EXPECT_EQ(sample.routed_experts, mixed.at(key).routed_experts) << key.first;
    ASSERT_EQ(sample.routed_experts.size(), sample.ids.size() - 1);
    replays.push_back(replay_of(sample, fmt::format("{}-{}-replay", key.first, key.second)));
  }
  const Outputs replayed = run(replays, 64, 64);
  for (const auto& [key, sample] : alone)
    EXPECT_EQ(replayed.at({fmt::format("{}-{}-replay", key.first, key.second), 0}).prompt_routed_experts,
              routing_read(sample));
}

TEST_F(CudaRoutedExpertsTest, TheCpuBackendRoutesAlikeInTheF32Mode) {
  std::vector<engine::RequestSpec> specs = workload(16);
  for (engine::RequestSpec& spec : specs) spec.sampling.temperature = 0.0;  // greedy: the same tokens
  const Outputs cpu = run(specs, 16, 64, engine::BackendKind::Cpu);
  const Outputs cuda = run(specs, 16, 64, engine::BackendKind::Cuda, engine::CudaWeights::F32);
  for (const auto& [key, sample] : cpu) {
    EXPECT_EQ(sample.prompt_routed_experts, cuda.at(key).prompt_routed_experts) << key.first;
    EXPECT_EQ(sample.routed_experts, cuda.at(key).routed_experts) << key.first;
  }
}

}  // namespace
}  // namespace jambo::testing
