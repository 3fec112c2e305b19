// Law 2: in checked mode every row's (request, slot, generation) is verified against the slot pool, so
// a stale lease fails the step with an error naming the request and slot, never as text; and a freed
// slot is poisoned with NaN, so a read that slips past the check still cannot look like a valid state.
#include "engine/model_runner.h"
#include "support/engine_test_util.h"

#include <cmath>

namespace jambo::testing {
namespace {

engine::EngineOptions checked_options(const model::Model& model) {
  return exact_engine_options(model, /*max_num_seqs=*/4, /*num_kv_blocks=*/32, /*kv_block_size=*/4,
                              /*max_model_len=*/32);
}

engine::RequestSpec request(const std::string& id, std::vector<int32_t> prompt) {
  engine::RequestSpec spec;
  spec.id = id;
  spec.prompt_ids = std::move(prompt);
  spec.stop.max_tokens = 8;
  spec.stop.ignore_eos = true;
  return spec;
}

TEST(EngineCheckedTest, StaleLeaseFailsTheStepNamingRequestAndSlot) {
  OneThread one_thread;
  const model::Model model = load_fixture_model();
  engine::Engine engine(model, nullptr, checked_options(model));
  engine.add_request(request("first", {5, 6, 7}));
  engine.add_request(request("second", {8, 9}));
  engine.step();  // both admitted, prompts run
  engine.step();
  EXPECT_EQ(engine.counters().law_violations, 0);

  engine.corrupt_lease_for_testing("second");
  try {
    const std::vector<engine::SampleOutput> outputs = engine.step();
    FAIL() << "a step over a stale lease returned " << outputs.size() << " outputs instead of failing";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("law 2"), std::string::npos) << message;
    EXPECT_NE(message.find("'second'"), std::string::npos) << message;
    EXPECT_NE(message.find("slot"), std::string::npos) << message;
  }
  EXPECT_EQ(engine.counters().law_violations, 1);
}

// Law 6: the numeric sequence id that the error names is in the trace, so the failing row joins its request.
TEST(EngineCheckedTest, TheSequenceAnErrorNamesIsTheTracesSequence) {
  OneThread one_thread;
  const model::Model model = load_fixture_model();
  TestTraceFile trace;
  engine::EngineOptions options = checked_options(model);
  options.trace_path = trace.path();
  engine::Engine engine(model, nullptr, options);
  engine.add_request(request("first", {5, 6, 7}));
  engine.add_request(request("second", {8, 9}));
  engine.step();
  engine.corrupt_lease_for_testing("second");
  std::string message;
  try {
    engine.step();
  } catch (const Error& error) {
    message = error.what();
  }
  const size_t at = message.find("(sequence ");
  ASSERT_NE(at, std::string::npos) << message;
  const int64_t sequence_id = std::stoll(message.substr(at + 10));
  int64_t num_rows = 0;
  for (const nlohmann::json& step : read_trace(trace.path(), "step"))
    for (const nlohmann::json& row : step["rows"])
      if (row["sequence"] == sequence_id) {
        EXPECT_EQ(row["request"], "second");
        ++num_rows;
      }
  EXPECT_GE(num_rows, 1) << "no trace row of sequence " << sequence_id;
}

// A row that reads a freed slot: poisoned in checked mode (NaN logits), still zero otherwise.
std::vector<float> logits_after_reading_freed_slot(const model::Model& model, bool checked) {
  backend::CacheConfig cache;
  cache.num_state_slots = 2;
  cache.num_kv_blocks = 2;
  cache.kv_block_size = 4;
  auto backend = backend::cpu::make_cpu_backend(model, cache);
  engine::SlotPool slots(cache.num_state_slots, engine::SlotPolicy::Lowest);
  engine::ModelRunner runner(*backend, slots, cache.kv_block_size, checked);
  runner.on_slot_freed(1);

  const std::vector<int32_t> tokens = {5};
  const std::vector<int32_t> block_table = {0, 1};
  backend::BatchRow row;
  row.tokens = tokens;
  row.start_position = 1;
  row.has_initial_state = true;
  row.slot = 1;
  row.block_table = block_table;
  row.copy_logits = backend::LogitsCopy::Last;
  backend::StepOutput output;
  backend->forward(std::span<const backend::BatchRow>(&row, 1), output);
  EXPECT_EQ(output.rows[0].finite, !checked);
  return output.values;
}

TEST(EngineCheckedTest, FreedSlotIsPoisonedOnlyInCheckedMode) {
  OneThread one_thread;
  const model::Model model = load_fixture_model();
  const std::vector<float> checked = logits_after_reading_freed_slot(model, /*checked=*/true);
  EXPECT_TRUE(std::all_of(checked.begin(), checked.end(), [](float x) { return std::isnan(x); }));
  const std::vector<float> unchecked = logits_after_reading_freed_slot(model, /*checked=*/false);
  EXPECT_TRUE(std::all_of(unchecked.begin(), unchecked.end(), [](float x) { return std::isfinite(x); }));
}

}  // namespace
}  // namespace jambo::testing
