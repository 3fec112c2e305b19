// The engine's sampling extensions (stop token ids, stop strings, min-p, n samples with their own
// seeds) and its request lifecycle around them: validation errors, abort, counters and the trace.
#include "backend/nonfinite_logits.h"
#include "support/engine_test_util.h"
#include "tokenizer/tokenizer.h"

#include <cmath>
#include <set>

namespace jambo::testing {
namespace {

engine::EngineOptions small_options(const model::Model& model) {
  return exact_engine_options(model, /*max_num_seqs=*/8, /*num_kv_blocks=*/128, /*kv_block_size=*/4,
                              /*max_model_len=*/64);
}

engine::RequestSpec request(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens) {
  engine::RequestSpec spec;
  spec.id = id;
  spec.prompt_ids = std::move(prompt);
  spec.stop.max_tokens = max_tokens;
  spec.stop.ignore_eos = true;
  spec.sampling.seed = 5;
  return spec;
}

engine::SampleOutput run_one(const model::Model& model, const tokenizer::Tokenizer* tokenizer,
                             const engine::RequestSpec& spec) {
  engine::Engine engine(model, tokenizer, small_options(model));
  Outputs outputs = run_to_end(engine, {spec});
  EXPECT_EQ(outputs.size(), 1u);
  return outputs.begin()->second;
}

class EngineSamplingTest : public ::testing::Test {
 protected:
  OneThread one_thread_;
  model::Model model_ = load_fixture_model();
};

TEST_F(EngineSamplingTest, StopTokenIdEndsTheSampleAfterIt) {
  const engine::SampleOutput full = run_one(model_, nullptr, request("full", {7, 8, 9}, 12));
  ASSERT_EQ(full.ids.size(), 12u);
  engine::RequestSpec spec = request("stopped", {7, 8, 9}, 12);
  const int32_t stop_token = full.ids[5];
  spec.stop.token_ids = {stop_token};
  const engine::SampleOutput stopped = run_one(model_, nullptr, spec);
  const size_t first = std::find(full.ids.begin(), full.ids.end(), stop_token) - full.ids.begin();
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(full.ids.begin(), full.ids.begin() + first + 1));
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(full.finish_reason, "length");
}

TEST_F(EngineSamplingTest, StopStringCutsTheTextAndEndsTheSample) {
  const std::string folder = std::string(JAMBO_SOURCE_DIR) + "/models/jambo-demo";
  const model::Model demo = model::load_model(folder);
  const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(folder);
  const engine::RequestSpec spec = request("story", tokenizer.encode("Once upon a time"), 24);
  const engine::SampleOutput full = run_one(demo, &tokenizer, spec);
  EXPECT_EQ(full.text, tokenizer.decode(full.ids, /*skip_special_tokens=*/true));
  ASSERT_GT(full.text.size(), 12u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);

  engine::RequestSpec with_stop = spec;
  with_stop.stop.strings = {"never appears \x01", stop};
  const engine::SampleOutput stopped = run_one(demo, &tokenizer, with_stop);
  EXPECT_EQ(stopped.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(stopped.finish_reason, "stop");
  ASSERT_LT(stopped.ids.size(), full.ids.size());
  EXPECT_TRUE(std::equal(stopped.ids.begin(), stopped.ids.end(), full.ids.begin()));
}

TEST_F(EngineSamplingTest, MinPKeepsOnlyTokensNearTheTopOne) {
  engine::RequestSpec greedy = request("greedy", {3, 4, 5}, 10);
  engine::RequestSpec only_top = greedy;
  only_top.sampling.temperature = 1.0;
  only_top.sampling.min_p = 1.0;  // nothing but the most likely token reaches p_max
  EXPECT_EQ(run_one(model_, nullptr, only_top).ids, run_one(model_, nullptr, greedy).ids);

  engine::RequestSpec filtered = greedy;
  filtered.n = 4;
  filtered.sampling.temperature = 1.0;
  filtered.num_top_logprobs = 1;
  filtered.sampling.min_p = 0.3;
  engine::Engine engine(model_, nullptr, small_options(model_));
  for (const auto& [key, output] : run_to_end(engine, {filtered}))
    for (size_t i = 0; i < output.ids.size(); ++i)
      EXPECT_GE(output.logprobs[i], output.top_logprobs[i][0].logprob + std::log(0.3) - 1e-12)
          << "sample " << key.second << " position " << i;
}

TEST_F(EngineSamplingTest, SamplesOfOneRequestHaveTheirOwnSeeds) {
  EXPECT_EQ(engine::sample_seed(42, 0), 42u);
  std::set<uint64_t> seeds;
  for (int64_t s = 0; s < 16; ++s) seeds.insert(engine::sample_seed(42, s));
  EXPECT_EQ(seeds.size(), 16u);

  engine::RequestSpec spec = request("many", {10, 11}, 8);
  spec.n = 4;
  spec.sampling.temperature = 2.0;
  engine::Engine engine(model_, nullptr, small_options(model_));
  std::set<std::vector<int32_t>> distinct;
  for (const auto& [key, output] : run_to_end(engine, {spec})) distinct.insert(output.ids);
  EXPECT_GT(distinct.size(), 1u) << "all 4 samples came out the same";
}

// The samples of a request share the prompt's full KV blocks (only read once the prompt has run) and take their
// own block for its partial last one; each sample still equals a lone request of its seed, which shares nothing.
TEST_F(EngineSamplingTest, ForkedSamplesShareThePromptsFullKvBlocks) {
  engine::RequestSpec spec =
      request("shared", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 6);  // blocks of 4: two full, one partial
  spec.n = 4;
  spec.sampling.temperature = 1.0;
  engine::Engine engine(model_, nullptr, small_options(model_));
  engine.add_request(spec);
  engine.step();  // the whole prompt, then the fork
  EXPECT_EQ(engine.counters().kv_blocks_used, 3 + (4 - 1) * 1);
  Outputs outputs = run_to_end(engine, {});
  ASSERT_EQ(outputs.size(), 4u);
  EXPECT_EQ(engine.counters().kv_blocks_used, 0);
  for (int64_t s = 0; s < 4; ++s) {
    engine::RequestSpec alone = spec;
    alone.n = 1;
    alone.sampling.seed = engine::sample_seed(*spec.sampling.seed, s);
    const engine::SampleOutput expected = run_one(model_, nullptr, alone);
    const engine::SampleOutput& actual = outputs.at({"shared", s});
    EXPECT_EQ(actual.ids, expected.ids) << "sample " << s;
    EXPECT_EQ(actual.logprobs, expected.logprobs) << "sample " << s;
  }
}

// A sample's weight_versions cover its tokens in order: one span of the options' version when nothing changed, and
// split where the weights were renamed between steps (a forked sample's too; preempted or not, the spans stay).
TEST_F(EngineSamplingTest, WeightVersionsSayWhichWeightsSampledWhichTokens) {
  engine::EngineOptions options = small_options(model_);
  options.weight_version = "v1";
  engine::Engine engine(model_, nullptr, options);
  EXPECT_EQ(engine.weight_version(), "v1");
  engine::RequestSpec spec = request("renamed", {1, 2, 3}, 6);
  spec.n = 2;
  engine.add_request(spec);
  int64_t num_steps = 0;
  Outputs outputs;
  while (engine.has_unfinished()) {
    if (++num_steps == 4) engine.set_weight_version("v2");
    for (engine::SampleOutput& output : engine.step()) outputs[{output.id, output.sample}] = std::move(output);
  }
  ASSERT_EQ(outputs.size(), 2u);
  for (const auto& [key, output] : outputs) {
    ASSERT_EQ(output.ids.size(), 6u);
    // The prompt's step samples token 0; steps 2 and 3 tokens 1 and 2 under v1; from step 4 on, v2.
    const std::vector<engine::WeightVersionSpan> expected = {{"v1", 0, 3}, {"v2", 3, 6}};
    EXPECT_EQ(output.weight_versions, expected) << "sample " << key.second;
  }
  EXPECT_EQ(run_one(model_, nullptr, request("plain", {1, 2, 3}, 4)).weight_versions,
            (std::vector<engine::WeightVersionSpan>{{"default", 0, 4}}));
}

TEST_F(EngineSamplingTest, PromptLogprobsStartWithNull) {
  engine::RequestSpec spec = request("prompt", {1, 2, 3, 4, 5}, 2);
  spec.num_prompt_logprobs = 3;
  const engine::SampleOutput output = run_one(model_, nullptr, spec);
  ASSERT_EQ(output.prompt_logprobs.size(), 5u);
  EXPECT_FALSE(output.prompt_logprobs[0].has_value());
  for (size_t p = 1; p < 5; ++p) {
    ASSERT_TRUE(output.prompt_logprobs[p].has_value());
    EXPECT_EQ(output.prompt_top_logprobs[p].size(), 3u);
  }
}

TEST_F(EngineSamplingTest, BadRequestsAreRejectedNamingTheFieldAndHarmNoOne) {
  engine::Engine engine(model_, nullptr, small_options(model_));
  const auto expect_rejected = [&](const engine::RequestSpec& spec, const std::string& field) {
    try {
      engine.add_request(spec);
      ADD_FAILURE() << "accepted a request with a bad " << field;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
    }
  };
  const engine::RequestSpec good = request("good", {1, 2, 3}, 4);
  engine::RequestSpec bad = good;
  bad.prompt_ids.clear();
  expect_rejected(bad, "prompt");
  bad = good;
  bad.prompt_ids = {1, 384};
  expect_rejected(bad, "384");
  bad = good;
  bad.n = 0;
  expect_rejected(bad, "field 'n'");
  bad.n = 9;
  expect_rejected(bad, "field 'n'");
  bad = good;
  bad.stop.max_tokens = 62;
  expect_rejected(bad, "max_model_len");
  bad = good;
  bad.sampling.top_p = 0.0;
  expect_rejected(bad, "top_p");
  bad = good;
  bad.sampling.min_p = 1.5;
  expect_rejected(bad, "min_p");
  bad = good;
  bad.stop.strings = {"x"};
  expect_rejected(bad, "tokenizer");
  bad = good;
  bad.stop.token_ids = {-1};
  expect_rejected(bad, "stop_token_ids");
  bad = good;
  bad.num_prompt_logprobs = 21;
  expect_rejected(bad, "prompt_logprobs");

  engine.add_request(good);
  expect_rejected(good, "already");
  Outputs outputs = run_to_end(engine, {});
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs.begin()->second.ids.size(), 4u);
}

TEST_F(EngineSamplingTest, AbortReturnsTheSampleAndFreesItsMemory) {
  engine::Engine engine(model_, nullptr, small_options(model_));
  engine::RequestSpec spec = request("long", {1, 2, 3}, 40);
  spec.n = 2;
  engine.add_request(spec);
  engine.step();
  engine.step();
  EXPECT_EQ(engine.counters().slots_used, 2);
  engine.abort_request("long");
  EXPECT_THROW(engine.abort_request("long"), Error);
  const std::vector<engine::SampleOutput> outputs = engine.step();
  ASSERT_EQ(outputs.size(), 2u);
  for (const engine::SampleOutput& output : outputs) {
    EXPECT_EQ(output.finish_reason, "abort");
    EXPECT_EQ(output.ids.size(), 2u);
  }
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.counters().slots_used + engine.counters().kv_blocks_used, 0);
}

// Logits that are not finite (a NaN in the final norm's weight makes every logit NaN) are counted in every mode:
// unchecked, the first row fails its request (engine_nonfinite_test.cpp); checked, it is a law 2 violation.
TEST_F(EngineSamplingTest, NonFiniteLogitsAreCountedInEveryMode) {
  model::Model model = make_random_model(model_.config, DType::F32, /*seed=*/3);
  const_cast<float*>(static_cast<const float*>(model.weights.final_norm.data))[0] = NAN;
  engine::EngineOptions options = small_options(model);
  options.checked = false;
  {
    engine::Engine engine(model, nullptr, options);
    EXPECT_THROW(run_to_end(engine, {request("nan", {1, 2, 3}, 4)}), backend::NonFiniteLogits);
    EXPECT_EQ(engine.counters().nonfinite_rows, 1);  // the prompt's row
    EXPECT_EQ(engine.counters().law_violations, 0);
  }
  options.checked = true;
  engine::Engine engine(model, nullptr, options);
  EXPECT_THROW(run_to_end(engine, {request("nan", {1, 2, 3}, 4)}), Error);
  EXPECT_EQ(engine.counters().nonfinite_rows, 1);
  EXPECT_EQ(engine.counters().law_violations, 1);
}

TEST_F(EngineSamplingTest, CountersAndTraceFollowEveryToken) {
  engine::EngineOptions options = small_options(model_);
  options.max_num_batched_tokens = 3;
  const TestTraceFile trace;
  options.trace_path = trace.path();
  std::vector<engine::RequestSpec> specs = {request("a", {1, 2, 3, 4, 5, 6, 7}, 5), request("b", {9}, 3)};
  specs[1].n = 3;
  engine::EngineCounters counters;
  {
    engine::Engine engine(model_, nullptr, options);
    run_to_end(engine, specs);
    counters = engine.counters();
  }
  EXPECT_EQ(counters.prefill_tokens, 7 + 1);                 // each prompt once: the samples of b share its prefill
  EXPECT_EQ(counters.decode_tokens, (5 - 1) + 3 * (3 - 1));  // the last token of a sample is never fed
  EXPECT_EQ(counters.preemptions, 0);
  EXPECT_EQ(counters.num_running + counters.num_waiting + counters.slots_used + counters.kv_blocks_used, 0);
  EXPECT_GT(counters.forward_seconds, 0.0);  // the backend's share of the steps' time

  std::map<std::string, int64_t> events;
  for (const auto& event : read_trace(options.trace_path, "event"))
    ++events[event["request"].get<std::string>() + ":" + event["event"].get<std::string>()];
  int64_t num_step_lines = 0, num_tokens_traced = 0;
  for (const auto& step : read_trace(options.trace_path, "step")) {
    EXPECT_EQ(step["step"], num_step_lines++);
    for (const auto& row : step["rows"]) {
      num_tokens_traced += row["num_tokens"].get<int64_t>();
      EXPECT_EQ(row["tokens"].size(), row["num_tokens"].get<size_t>());
      EXPECT_GE(row["kv_blocks"].size(), 1u);
    }
  }
  EXPECT_EQ(num_step_lines, counters.steps);
  EXPECT_EQ(num_tokens_traced, counters.prefill_tokens + counters.decode_tokens);
  const std::map<std::string, int64_t> expected_events = {
      {"a:queued", 1}, {"a:admitted", 1}, {"a:prefill_done", 1}, {"a:finished", 1},
      {"b:queued", 1}, {"b:admitted", 3}, {"b:prefill_done", 1}, {"b:finished", 3}};
  EXPECT_EQ(events, expected_events);
}

}  // namespace
}  // namespace jambo::testing
