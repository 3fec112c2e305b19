// Law 1: the phase comes from the state, not from the token count. A one-token prompt, and a new
// request admitted with a one-token chunk (a nearly spent budget) while the slot pool hands out slots
// just freed by others, run the prefill path from zero state and come out as if run alone.
#include "support/engine_test_util.h"

namespace jambo::testing {
namespace {

struct PhaseRun {
  Outputs outputs;
  engine::EngineCounters counters;
  std::vector<nlohmann::json> steps;  // the trace's step lines
};

PhaseRun run_traced(const model::Model& model, const std::vector<engine::RequestSpec>& specs,
                    int64_t max_num_batched_tokens, int64_t max_num_seqs) {
  engine::EngineOptions options = exact_engine_options(model, max_num_seqs, /*num_kv_blocks=*/64, /*kv_block_size=*/4,
                                                       /*max_model_len=*/32);
  options.max_num_batched_tokens = max_num_batched_tokens;
  options.slot_policy = engine::SlotPolicy::Lowest;  // a freed slot is handed out again at once
  const TestTraceFile trace;
  options.trace_path = trace.path();
  PhaseRun run;
  {
    engine::Engine engine(model, nullptr, options);
    run.outputs = run_to_end(engine, specs);
    run.counters = engine.counters();
  }
  run.steps = read_trace(options.trace_path, "step");
  return run;
}

bool is_fresh_one_token_chunk(const nlohmann::json& row) { return row["start"] == 0 && row["num_tokens"] == 1; }

class EnginePhaseTest : public ::testing::Test {
 protected:
  OneThread one_thread_;
  model::Model model_ = load_fixture_model();
};

TEST_F(EnginePhaseTest, OneTokenBudgetRunsFreshRequestsFromZeroState) {
  const std::vector<engine::RequestSpec> specs = random_workload(model_, 24, /*seed=*/11, /*max_prompt=*/12, false);
  const PhaseRun run = run_traced(model_, specs, /*max_num_batched_tokens=*/1, /*max_num_seqs=*/3);
  expect_bitwise_equal(run_alone(model_, specs), run.outputs);
  EXPECT_GT(run.counters.slot_reuses, 0);
  EXPECT_EQ(run.counters.law_violations, 0);
  int64_t num_fresh_chunks = 0;
  for (const auto& step : run.steps) {
    ASSERT_EQ(step["rows"].size(), 1u);
    const auto& row = step["rows"][0];
    EXPECT_EQ(row["has_initial_state"], row["start"] != 0) << row.dump();
    if (is_fresh_one_token_chunk(row)) {
      EXPECT_EQ(row["phase"], "prefill") << row.dump();
      ++num_fresh_chunks;
    }
  }
  EXPECT_GE(num_fresh_chunks, int64_t(specs.size()));
}

TEST_F(EnginePhaseTest, LeftoverOneTokenBudgetAdmitsBesideDecodes) {
  const std::vector<engine::RequestSpec> specs = random_workload(model_, 32, /*seed=*/12, /*max_prompt=*/12, false);
  const PhaseRun run = run_traced(model_, specs, /*max_num_batched_tokens=*/5, /*max_num_seqs=*/6);
  expect_bitwise_equal(run_alone(model_, specs), run.outputs);
  EXPECT_GT(run.counters.slot_reuses, 0);
  // The historical bug's setting: a brand-new request gets the one token the decodes left.
  int64_t num_admitted_beside_decodes = 0;
  for (const auto& step : run.steps) {
    bool has_decode = false;
    for (const auto& row : step["rows"]) has_decode |= row["phase"] == "decode";
    for (const auto& row : step["rows"]) {
      EXPECT_EQ(row["has_initial_state"], row["start"] != 0) << row.dump();
      const size_t prompt_size = specs[std::stoul(row["request"].get<std::string>().substr(1))].prompt_ids.size();
      if (has_decode && is_fresh_one_token_chunk(row) && prompt_size > 1) ++num_admitted_beside_decodes;
    }
  }
  EXPECT_GT(num_admitted_beside_decodes, 0);
}

}  // namespace
}  // namespace jambo::testing
