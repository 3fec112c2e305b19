// The forensics bite: `jambo stress` finds nothing on a correct engine and flags samples when either of
// the two historical state-cache bugs is injected (DESIGN.md, "Why"), or a prefix hit is served a stale checkpoint.
#include "support/forensics_test_util.h"

#include <gtest/gtest.h>

#include <set>

namespace jambo::forensics {
namespace {

class StressTest : public ::testing::Test {
 protected:
  StressResult run(const engine::EngineFaults& faults) { return testing::run_small_stress(model_, faults); }

  model::Model model_ = testing::load_fixture_model("moe-top2-gqa2-fp32");
};

TEST_F(StressTest, ACorrectEngineIsFlaggedNowhere) {
  const StressResult result = run({});
  EXPECT_EQ(result.comparison.num_flagged(), 0);
  EXPECT_GT(result.comparison.samples.size(), 40u);  // n > 1 for some requests
  EXPECT_GT(result.counters.slot_reuses, 10);        // the workload really recycles slots
  EXPECT_EQ(result.counters.law_violations, 0);
  // Slot policy highest: the first request took the top slot; the summary places it by these two figures.
  EXPECT_EQ(result.counters.highest_slot_used, result.counters.slots_total - 1);
  EXPECT_EQ(result.state_elements_per_slot,
            backend::cpu::make_cpu_backend(model_, backend::CacheConfig{})->state_elements_per_slot());
}

// Prompts from 3 shared prefixes over a pool of 3 checkpoints and KV blocks for a few requests: requests resume
// from cached prefixes and the cache evicts all the time, and every sample still equals the reference's bits.
TEST_F(StressTest, SharedPrefixesUnderConstantEvictionAreFlaggedNowhere) {
  const StressResult result = testing::run_small_stress(model_, {}, engine::BackendKind::Cpu, /*num_shared_prefixes=*/3);
  EXPECT_EQ(result.comparison.num_flagged(), 0);
  ASSERT_NE(result.comparison.worst(), nullptr);
  EXPECT_EQ(result.comparison.worst()->max_abs_diff, 0.0);  // every logprob the reference's bits
  const engine::PrefixCacheCounters& cache = result.counters.prefix_cache;
  EXPECT_TRUE(result.counters.prefix_caching);
  EXPECT_GT(cache.hit_tokens, 0);
  EXPECT_GT(cache.checkpoint_evictions + cache.kv_block_evictions, 0);
  EXPECT_EQ(result.counters.law_violations, 0);
}

// With K shared prefixes, every prompt of more than one token starts with one of K prefixes, within the longest
// prompt; without, the workload is the one it always was (its figures in bench/HISTORY.md stay comparable).
TEST(StressWorkloadTest, SharedPrefixesStartThePromptsAndChangeNothingElse) {
  StressWorkload workload;
  workload.num_requests = 80;
  workload.max_prompt_tokens = 60;
  const std::vector<engine::RequestSpec> plain = make_stress_requests(workload, 100);
  workload.num_shared_prefixes = 4;
  const std::vector<engine::RequestSpec> shared = make_stress_requests(workload, 100);
  std::set<std::vector<int32_t>> first_tokens;
  for (const engine::RequestSpec& spec : shared) {
    EXPECT_LE(int64_t(spec.prompt_ids.size()), workload.max_prompt_tokens);
    if (spec.prompt_ids.size() > 1) first_tokens.insert({spec.prompt_ids.begin(), spec.prompt_ids.begin() + 1});
  }
  EXPECT_LE(first_tokens.size(), 4u);
  workload.num_shared_prefixes = 0;
  const std::vector<engine::RequestSpec> again = make_stress_requests(workload, 100);
  ASSERT_EQ(again.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(again[i].prompt_ids, plain[i].prompt_ids);
}

TEST(StressWorkloadTest, SamplesPerPromptStayWithinMinAndMax) {
  StressWorkload workload;
  workload.num_requests = 60;
  workload.min_samples = workload.max_samples = 16;
  for (const engine::RequestSpec& spec : make_stress_requests(workload, 100)) EXPECT_EQ(spec.n, 16);
  workload.min_samples = 2;
  workload.max_samples = 3;
  std::set<int64_t> seen;
  for (const engine::RequestSpec& spec : make_stress_requests(workload, 100)) seen.insert(spec.n);
  EXPECT_EQ(seen, (std::set<int64_t>{2, 3}));
  workload.min_samples = 4;
  EXPECT_THROW(make_stress_requests(workload, 100), Error);
}

TEST_F(StressTest, DecodeBeforePrefillIsFlagged) {
  engine::EngineFaults faults;
  faults.decode_before_prefill = true;
  EXPECT_GT(run(faults).comparison.num_flagged(), 0);
}

TEST_F(StressTest, WrappedStateOffsetsAreFlagged) {
  engine::EngineFaults faults;
  faults.wrap_state_offsets = true;
  EXPECT_GT(run(faults).comparison.num_flagged(), 0);
}

// A prefix hit that resumes from another prefix's checkpoint, or a shorter prefix's, passes every owner and
// generation check; only the logprobs show it.
TEST_F(StressTest, StaleCheckpointsAreFlagged) {
  engine::EngineFaults faults;
  faults.serve_stale_checkpoint = true;
  const StressResult result = testing::run_small_stress(model_, faults, engine::BackendKind::Cpu, 3);
  EXPECT_GT(result.counters.prefix_cache.hit_tokens, 0);
  EXPECT_GT(result.comparison.num_flagged(), 0);
  EXPECT_EQ(result.counters.law_violations, 0);
}

}  // namespace
}  // namespace jambo::forensics
