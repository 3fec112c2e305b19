// The forensics bite: `jambo stress` finds nothing on a correct engine and flags samples when either of
// the two historical state-cache bugs is injected (DESIGN.md, "Why").
#include "engine/memory_budget.h"
#include "forensics/stress.h"

#include <gtest/gtest.h>

namespace jambo {
namespace {

class StressTest : public ::testing::Test {
 protected:
  StressResult run(const EngineFaults& faults) {
    StressWorkload workload;
    workload.num_requests = 40;
    workload.max_prompt_tokens = 40;
    workload.max_new_tokens = 6;
    workload.max_samples = 3;
    workload.seed = 11;
    EngineOptions options;
    options.max_num_batched_tokens = 8;
    options.max_model_len = workload.max_prompt_tokens + workload.max_new_tokens;
    options.slot_policy = SlotPolicy::Highest;
    options.max_num_seqs = workload.max_samples + 2;  // few slots: fast reuse
    const int64_t blocks_per_sequence = (options.max_model_len + options.kv_block_size - 1) / options.kv_block_size;
    options.memory_budget = std::to_string(
        exact_memory_budget(model_.config, model_.weights.bytes_total, options.max_num_seqs,
                            workload.max_samples * blocks_per_sequence, options.kv_block_size));
    options.faults = faults;
    return run_stress(model_, nullptr, options, workload, kDefaultCompareThreshold);
  }

  Model model_ = load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/moe-top2-gqa2-fp32");
};

TEST_F(StressTest, ACorrectEngineIsFlaggedNowhere) {
  const StressResult result = run({});
  EXPECT_EQ(result.comparison.num_flagged(), 0);
  EXPECT_GT(result.comparison.samples.size(), 40u);  // n > 1 for some requests
  EXPECT_GT(result.counters.slot_reuses, 10);       // the workload really recycles slots
  EXPECT_EQ(result.counters.law_violations, 0);
}

TEST_F(StressTest, DecodeBeforePrefillIsFlagged) {
  EngineFaults faults;
  faults.decode_before_prefill = true;
  EXPECT_GT(run(faults).comparison.num_flagged(), 0);
}

TEST_F(StressTest, WrappedStateOffsetsAreFlagged) {
  EngineFaults faults;
  faults.wrap_state_offsets = true;
  EXPECT_GT(run(faults).comparison.num_flagged(), 0);
}

}  // namespace
}  // namespace jambo
