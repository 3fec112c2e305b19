// return_routed_experts: each sample says which k experts each MoE layer routed each token it read to, in the
// shape a trainer replays (prompt tokens, then every generated token but the last). The routing is a token's own:
// the same run alone or among others, in chunks or after a preemption, and the same as a one-shot prefill of the
// whole sequence gives its prompt, which is what a trainer's forward pass over the rollout computes.
#include "support/engine_test_util.h"

#include <set>

namespace jambo::testing {
namespace {

class RoutedExpertsTest : public ::testing::Test {
 protected:
  std::vector<engine::RequestSpec> workload(int64_t count, bool allow_n) const {
    std::vector<engine::RequestSpec> specs = random_workload(model_, count, /*seed=*/7, 30, allow_n);
    for (engine::RequestSpec& spec : specs) spec.return_routed_experts = true;
    return specs;
  }
  Outputs run(const std::vector<engine::RequestSpec>& specs, int64_t max_num_seqs, int64_t max_num_batched_tokens,
              int64_t num_kv_blocks = 64 * 8) const {
    engine::EngineOptions options = exact_engine_options(model_, max_num_seqs, num_kv_blocks, 8, 64);
    options.max_num_batched_tokens = max_num_batched_tokens;
    engine::Engine engine(model_, nullptr, options);
    Outputs outputs = run_to_end(engine, specs);
    num_preemptions_ = engine.counters().preemptions;
    return outputs;
  }

  OneThread one_thread_;
  model::Model model_ = load_fixture_model();  // 4 MoE layers of 4 experts, top-2
  mutable int64_t num_preemptions_ = 0;         // of the last run
};

TEST_F(RoutedExpertsTest, EveryTokenReadHasKIncreasingExpertsPerMoeLayer) {
  const int64_t num_layers = model_.config.num_moe_layers(), k = model_.config.num_experts_per_tok;
  ASSERT_GT(num_layers, 0);
  std::set<std::vector<int32_t>> seen;
  for (const auto& [key, sample] : run(workload(16, /*allow_n=*/true), 8, 24)) {
    ASSERT_EQ(sample.prompt_routed_experts.size(), sample.prompt_ids.size()) << key.first;
    ASSERT_EQ(sample.routed_experts.size(), sample.ids.size() - 1) << key.first;
    for (const auto* tokens : {&sample.prompt_routed_experts, &sample.routed_experts})
      for (const engine::TokenRouting& routing : *tokens) {
        ASSERT_EQ(int64_t(routing.size()), num_layers);
        for (const std::vector<int32_t>& experts : routing) {
          ASSERT_EQ(int64_t(experts.size()), k);
          for (size_t i = 0; i < experts.size(); ++i) {
            EXPECT_GE(experts[i], 0);
            EXPECT_LT(experts[i], model_.config.num_experts);
            if (i > 0) {
              EXPECT_LT(experts[i - 1], experts[i]);
            }
          }
          seen.insert(experts);
        }
      }
  }
  EXPECT_GT(seen.size(), 2u) << "the tokens were all routed alike";
}

// Alone and one-shot (one request at a time, whole prompts) against all 64 at once in steps of 32 tokens with a KV
// cache tight enough to preempt (engine_settings.h's "preemption"), n = 4 forks sharing their prompt's routing.
TEST_F(RoutedExpertsTest, ARequestsRoutingIsItsOwn) {
  const std::vector<engine::RequestSpec> specs = workload(64, /*allow_n=*/true);
  Outputs alone;
  for (const engine::RequestSpec& spec : specs) alone.merge(run({spec}, spec.n, 64));
  const Outputs mixed = run(specs, 64, 32, /*num_kv_blocks=*/24);
  EXPECT_GT(num_preemptions_, 0);
  ASSERT_EQ(alone.size(), mixed.size());
  for (const auto& [key, sample] : alone) {
    EXPECT_EQ(sample.prompt_routed_experts, mixed.at(key).prompt_routed_experts) << key.first;
    EXPECT_EQ(sample.routed_experts, mixed.at(key).routed_experts) << key.first;
  }
}

// The trainer's view: a prefill of prompt + generated tokens routes its prompt as the rollout routed every token.
TEST_F(RoutedExpertsTest, APrefillOfTheWholeSequenceRoutesItAlike) {
  const Outputs rollout = run(workload(8, /*allow_n=*/false), 8, 24);
  std::vector<engine::RequestSpec> replays;
  for (const auto& [key, sample] : rollout) replays.push_back(replay_of(sample, key.first + "-replay"));
  const Outputs replayed = run(replays, 8, 64);
  for (const auto& [key, sample] : rollout)
    EXPECT_EQ(replayed.at({key.first + "-replay", 0}).prompt_routed_experts, routing_read(sample)) << key.first;
}

}  // namespace
}  // namespace jambo::testing
