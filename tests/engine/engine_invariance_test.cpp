// Laws 4 and 5: every sample's ids and logprobs are bitwise equal between running it alone (one-shot
// prefill, nothing else in the batch) and running it among 64 requests, however the engine is set:
// token budget, sequences at once, memory so tight that preemption happens, n = 1 and 4, slot policy.
#include "support/engine_test_util.h"

namespace jambo::testing {
namespace {

struct Setting {
  std::string name;
  int64_t max_num_batched_tokens = 64;
  int64_t max_num_seqs = 64;
  engine::SlotPolicy slot_policy = engine::SlotPolicy::Lowest;
  int64_t num_kv_blocks = 0;  // 0: plenty; else the memory budget holds exactly this many
  bool allow_n = true;        // n = 4 for some requests (needs max_num_seqs >= 4)
};

void PrintTo(const Setting& setting, std::ostream* out) { *out << setting.name; }

constexpr int64_t kKvBlockSize = 8;
constexpr int64_t kMaxModelLen = 48;

class EngineInvarianceTest : public ::testing::TestWithParam<Setting> {
 protected:
  OneThread one_thread_;
  model::Model model_ = load_fixture_model();
};

TEST_P(EngineInvarianceTest, EveryRequestMatchesItsRunAlone) {
  const Setting& setting = GetParam();
  const std::vector<engine::RequestSpec> specs = random_workload(model_, 64, /*seed=*/7, 40, setting.allow_n);
  const int64_t num_kv_blocks = setting.num_kv_blocks > 0 ? setting.num_kv_blocks : 64 * 4 * 6;
  engine::EngineOptions options =
      exact_engine_options(model_, setting.max_num_seqs, num_kv_blocks, kKvBlockSize, kMaxModelLen);
  options.max_num_batched_tokens = setting.max_num_batched_tokens;
  options.slot_policy = setting.slot_policy;
  options.slot_seed = 3;
  const TestTraceFile trace;
  options.trace_path = trace.path();
  engine::Engine engine(model_, nullptr, options);

  const Outputs outputs = run_to_end(engine, specs);
  expect_bitwise_equal(run_alone(model_, specs), outputs);

  const engine::EngineCounters& counters = engine.counters();
  EXPECT_EQ(counters.law_violations, 0);
  EXPECT_EQ(counters.num_running + counters.num_waiting + counters.slots_used + counters.kv_blocks_used, 0);
  if (setting.num_kv_blocks == 0) return;
  // The tight budget must preempt both kinds of victim: sequences still on their prompt, and samples
  // that must recompute tokens they generated.
  int64_t num_on_prompt = 0, num_with_generated = 0;
  for (const auto& event : read_trace(options.trace_path, "event")) {
    if (event["event"] != "preempted") continue;
    num_on_prompt += event["num_generated"] == 0;
    num_with_generated += event["num_generated"] > 0;
  }
  EXPECT_EQ(num_on_prompt + num_with_generated, counters.preemptions);
  EXPECT_GT(num_on_prompt, 0);
  EXPECT_GT(num_with_generated, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Settings, EngineInvarianceTest,
    ::testing::Values(Setting{.name = "budget_1", .max_num_batched_tokens = 1},
                      Setting{.name = "budget_7", .max_num_batched_tokens = 7}, Setting{.name = "budget_64"},
                      Setting{.name = "budget_large", .max_num_batched_tokens = 100000},
                      Setting{.name = "seqs_1", .max_num_seqs = 1, .allow_n = false},
                      Setting{.name = "seqs_8", .max_num_seqs = 8},
                      Setting{.name = "preemption", .max_num_batched_tokens = 32, .num_kv_blocks = 24},
                      Setting{.name = "n_1_only", .allow_n = false},
                      Setting{.name = "highest_slots", .slot_policy = engine::SlotPolicy::Highest},
                      Setting{.name = "random_slots", .max_num_seqs = 8, .slot_policy = engine::SlotPolicy::Random}),
    [](const ::testing::TestParamInfo<Setting>& info) { return info.param.name; });

}  // namespace
}  // namespace jambo::testing
