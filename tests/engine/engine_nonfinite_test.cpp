// Logits that are not finite fail their request loudly and alone: the request's samples end with the error naming
// request, sample, sequence and step, its memory is freed, step() throws NonFiniteLogits once the rest of the step
// is done, and the other requests go on as if it had never been there.
#include "backend/nonfinite_logits.h"
#include "support/engine_test_util.h"
#include "support/overflowing_model.h"

#include <gmock/gmock.h>

namespace jambo::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

engine::RequestSpec request(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens, int64_t n = 1) {
  engine::RequestSpec spec;
  spec.id = id;
  spec.prompt_ids = std::move(prompt);
  spec.stop.max_tokens = max_tokens;
  spec.stop.ignore_eos = true;
  spec.n = n;
  return spec;
}

// Steps until nothing is left; the outputs, and the errors step() threw, in order.
struct Steps {
  Outputs outputs;
  std::vector<std::string> errors;
};

Steps run_catching(engine::Engine& engine) {
  Steps run;
  for (int64_t step = 0; engine.has_unfinished(); ++step) {
    if (step > 1000) throw std::runtime_error("the engine does not finish");
    try {
      for (engine::SampleOutput& output : engine.step()) run.outputs[{output.id, output.sample}] = std::move(output);
    } catch (const backend::NonFiniteLogits& error) {
      run.errors.push_back(error.what());
    }
  }
  return run;
}

engine::EngineOptions options_for(const model::Model& model, int64_t max_num_seqs) {
  engine::EngineOptions options = exact_engine_options(model, max_num_seqs, /*num_kv_blocks=*/64,
                                                       /*kv_block_size=*/4, /*max_model_len=*/32);
  options.checked = false;
  return options;
}

class EngineNonFiniteTest : public ::testing::Test {
 protected:
  OneThread one_thread_;
  model::Model model_ = overflowing_model();
};

// "bad" takes one token from its first position, then overflows at step 1; "good" needs its first position only.
TEST_F(EngineNonFiniteTest, ARequestWhoseLogitsAreNotFiniteFailsAloneNamingItsStep) {
  engine::Engine engine(model_, nullptr, options_for(model_, 4));
  std::vector<std::string> listener_errors;
  engine.set_progress_listener([&](const engine::SampleProgress& progress) {
    if (progress.finished && !progress.output.error.empty()) listener_errors.push_back(progress.output.error);
  });
  engine.add_request(request("bad", {7}, 3));
  engine.add_request(request("good", {5}, 1));
  const Steps run = run_catching(engine);

  ASSERT_EQ(run.errors.size(), 1u);
  EXPECT_THAT(run.errors[0], StartsWith("request 'bad' sample 0 (sequence 0), step 1: the logits are not finite "
                                        "(NaN or infinity)"));
  const engine::SampleOutput& bad = run.outputs.at({"bad", 0});
  EXPECT_EQ(bad.finish_reason, "error");
  EXPECT_EQ(bad.error, run.errors[0]);
  EXPECT_EQ(bad.ids.size(), 1u);  // the token of its first position
  EXPECT_EQ(listener_errors, std::vector<std::string>({run.errors[0]}));

  const engine::SampleOutput& good = run.outputs.at({"good", 0});
  EXPECT_EQ(good.finish_reason, "length");
  EXPECT_TRUE(good.error.empty());
  engine::Engine alone(model_, nullptr, options_for(model_, 4));
  const engine::SampleOutput good_alone = run_to_end(alone, {request("good", {5}, 1)}).at({"good", 0});
  EXPECT_EQ(good.ids, good_alone.ids);
  EXPECT_EQ(good.logprobs, good_alone.logprobs);

  const engine::EngineCounters& counters = engine.counters();
  EXPECT_EQ(counters.nonfinite_rows, 1);
  EXPECT_EQ(counters.slots_used, 0);
  EXPECT_EQ(counters.kv_blocks_used, 0);
  EXPECT_EQ(counters.num_running + counters.num_waiting, 0);
}

// Every row whose logits are not finite fails its own request; a request with n samples fails whole.
TEST_F(EngineNonFiniteTest, EachFailedRequestIsNamedAndAllItsSamplesEnd) {
  const TestTraceFile trace;
  engine::EngineOptions options = options_for(model_, 8);
  options.trace_path = trace.path();
  engine::Engine engine(model_, nullptr, options);
  engine.add_request(request("two-tokens", {1, 2}, 2));
  engine.add_request(request("forked", {3, 4, 5}, 2, /*n=*/3));
  engine.add_request(request("one-token", {6}, 1, /*n=*/2));
  const Steps run = run_catching(engine);

  ASSERT_EQ(run.errors.size(), 1u);  // both fail in step 0
  EXPECT_THAT(run.errors[0], StartsWith("request 'two-tokens' sample 0 (sequence 0), step 0: the logits are not"));
  EXPECT_THAT(run.errors[0], HasSubstr("(and 1 more requests failed in this step)"));
  for (int64_t s = 0; s < 3; ++s) {
    const engine::SampleOutput& sample = run.outputs.at({"forked", s});
    EXPECT_EQ(sample.finish_reason, "error") << s;
    EXPECT_THAT(sample.error, StartsWith("request 'forked' sample 0 (sequence 1), step 0: ")) << s;
  }
  for (int64_t s = 0; s < 2; ++s) EXPECT_EQ(run.outputs.at({"one-token", s}).finish_reason, "length") << s;
  const std::vector<nlohmann::json> failed = [&] {
    std::vector<nlohmann::json> events;
    for (nlohmann::json& event : read_trace(trace.path(), "event"))
      if (event["event"] == "failed") events.push_back(std::move(event));
    return events;
  }();
  EXPECT_EQ(failed.size(), 4u);  // two-tokens, and forked's three samples
  EXPECT_EQ(engine.counters().slots_used, 0);
  EXPECT_EQ(engine.counters().kv_blocks_used, 0);
}

// A request failing in the step that completes its prompt has already handed its other samples their reserved
// slots: the reservation ends once, so later forks are admitted only into slots that are free.
TEST_F(EngineNonFiniteTest, TheSlotsOfAFailedForkComeBackOnce) {
  engine::Engine engine(model_, nullptr, options_for(model_, 4));
  engine.add_request(request("forked", {3, 4}, 2, /*n=*/2));
  EXPECT_EQ(run_catching(engine).errors.size(), 1u);
  engine.add_request(request("three", {9}, 1, /*n=*/3));
  engine.add_request(request("two", {8}, 1, /*n=*/2));  // waits: one slot is left while "three" runs
  const Steps run = run_catching(engine);
  EXPECT_TRUE(run.errors.empty());
  EXPECT_EQ(run.outputs.size(), 5u);
  for (const auto& [key, output] : run.outputs) EXPECT_EQ(output.finish_reason, "length") << key.first;
  EXPECT_EQ(engine.counters().slots_used, 0);
}

// The checked mode takes logits that are not finite for a read of a poisoned slot (law 2) and fails the step.
TEST_F(EngineNonFiniteTest, TheCheckedModeRefusesThemAsALawTwoViolation) {
  engine::EngineOptions options = options_for(model_, 4);
  options.checked = true;
  engine::Engine engine(model_, nullptr, options);
  engine.add_request(request("bad", {1, 2}, 1));
  try {
    engine.step();
    FAIL() << "no error";
  } catch (const backend::NonFiniteLogits& error) {
    FAIL() << "not refused as a law 2 violation: " << error.what();
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("law 2 violation: request 'bad' sample 0 (sequence 0)"));
  }
  EXPECT_EQ(engine.counters().law_violations, 1);
}

}  // namespace
}  // namespace jambo::testing
