// The forensics bite: `jambo stress` finds nothing on a correct engine and flags samples when either of
// the two historical state-cache bugs is injected (DESIGN.md, "Why").
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

}  // namespace
}  // namespace jambo::forensics
