// Helpers of the engine tests: a tiny fixture model, random workloads, the engine run to the end, each request run
// alone, and the independent reference: every logprob scored again by SequenceRunner (one-shot prefill).
#pragma once

#include "engine/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/memory_budget.h"
#include "forensics/sequence_runner.h"
#include "engine/sequence_sampler.h"
#include "model/weights.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace jambo::testing {

// One OpenMP thread while alive: on models this small threads only add overhead (and stall on a busy
// 2-core machine); the backend's own tests show its results do not depend on the thread count.
class OneThread {
 public:
  OneThread() : saved_num_threads_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_num_threads_); }

 private:
  int saved_num_threads_;
};

inline model::Model load_fixture_model(const std::string& name = "moe-top2-gqa2-fp32") {
  return model::load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/" + name);
}

// Checked-mode options whose memory budget holds the weights as `backend` holds them, exactly max_num_seqs
// state slots and num_kv_blocks KV blocks.
inline engine::EngineOptions exact_engine_options(const model::Model& model, int64_t max_num_seqs,
                                                  int64_t num_kv_blocks, int64_t kv_block_size, int64_t max_model_len,
                                                  engine::BackendKind backend = engine::BackendKind::Cpu) {
  engine::EngineOptions options;
  options.backend.kind = backend;
  options.max_num_seqs = max_num_seqs;
  options.kv_block_size = kv_block_size;
  options.max_model_len = max_model_len;
  options.checked = true;
  options.memory_budget = {.bytes =
                               engine::exact_memory_budget(model.config, backend_weight_bytes(backend, model),
                                                           max_num_seqs, num_kv_blocks, kv_block_size, DType::F32)};
  return options;
}

// num_requests requests with prompts of 1..max_prompt random tokens, greedy and seeded sampled ones,
// some with n = 4 (when allow_n is set), top logprobs and prompt logprobs.
inline std::vector<engine::RequestSpec> random_workload(const model::Model& model, int64_t num_requests, uint64_t seed,
                                                        int64_t max_prompt = 40, bool allow_n = true) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t low, int64_t high) { return std::uniform_int_distribution<int64_t>(low, high)(rng); };
  std::vector<engine::RequestSpec> specs;
  for (int64_t i = 0; i < num_requests; ++i) {
    engine::RequestSpec spec;
    spec.id = fmt::format("r{}", i);
    const int64_t num_prompt = i % 5 == 0 ? 1 : uniform(1, max_prompt);  // plenty of one-token prompts
    for (int64_t t = 0; t < num_prompt; ++t)
      spec.prompt_ids.push_back(int32_t(uniform(0, model.config.vocab_size - 1)));
    spec.n = allow_n && i % 4 == 1 ? 4 : 1;
    spec.stop.max_tokens = uniform(1, 8);
    spec.num_top_logprobs = uniform(0, 3);
    if (i % 2 == 1) {
      spec.sampling.temperature = 0.9;
      spec.sampling.top_k = i % 3 == 0 ? 20 : 0;
      spec.sampling.top_p = i % 7 == 0 ? 0.9 : 1.0;
    }
    spec.sampling.seed = uint64_t(1000 + i);
    if (i % 6 == 0) spec.num_prompt_logprobs = 2;
    specs.push_back(spec);
  }
  return specs;
}

// A trace file of the running test alone (ctest runs the tests of one program in parallel processes), in the
// test temp folder and removed when the test is done with it.
class TestTraceFile {
 public:
  TestTraceFile() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "." + info->name();
    std::replace(name.begin(), name.end(), '/', '_');
    path_ = ::testing::TempDir() + name + "." + std::to_string(getpid()) + ".trace.jsonl";
  }
  ~TestTraceFile() { std::remove(path_.c_str()); }
  TestTraceFile(const TestTraceFile&) = delete;
  TestTraceFile& operator=(const TestTraceFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The lines of a JSONL trace whose "type" is `type` ("step" or "event").
inline std::vector<nlohmann::json> read_trace(const std::string& path, const std::string& type) {
  std::vector<nlohmann::json> lines;
  std::ifstream trace(path);
  for (std::string line; std::getline(trace, line);) {
    nlohmann::json json = nlohmann::json::parse(line);
    if (json["type"] == type) lines.push_back(std::move(json));
  }
  return lines;
}

// Runs the engine until every request is done; outputs keyed by (id, sample).
using Outputs = std::map<std::pair<std::string, int64_t>, engine::SampleOutput>;

// A trainer's forward pass over a rollout sample, as a request: its prompt and every generated token but the last
// as one prompt, routed experts asked. Its prompt_routed_experts must equal routing_read(sample).
inline engine::RequestSpec replay_of(const engine::SampleOutput& sample, std::string id) {
  engine::RequestSpec replay;
  replay.id = std::move(id);
  replay.prompt_ids = sample.prompt_ids;
  replay.prompt_ids.insert(replay.prompt_ids.end(), sample.ids.begin(), sample.ids.end() - 1);
  replay.stop.max_tokens = 1;
  replay.return_routed_experts = true;
  return replay;
}

// The routing of every token a sample's model read: the prompt's, then the generated tokens'.
inline std::vector<engine::TokenRouting> routing_read(const engine::SampleOutput& sample) {
  std::vector<engine::TokenRouting> routing = sample.prompt_routed_experts;
  routing.insert(routing.end(), sample.routed_experts.begin(), sample.routed_experts.end());
  return routing;
}

inline Outputs run_to_end(engine::Engine& engine, const std::vector<engine::RequestSpec>& specs) {
  for (const engine::RequestSpec& spec : specs) engine.add_request(spec);
  Outputs outputs;
  int64_t num_steps = 0;
  while (engine.has_unfinished()) {
    for (engine::SampleOutput& output : engine.step()) {
      const auto key = std::pair(output.id, output.sample);
      EXPECT_FALSE(outputs.count(key)) << output.id << " sample " << output.sample << " finished twice";
      outputs[key] = std::move(output);
    }
    if (++num_steps > 1000000) throw std::runtime_error("the engine does not finish");
  }
  return outputs;
}

// Every logprob of every sample, prompt and generated, against the independent reference: prompt plus generated
// tokens scored by SequenceRunner in one one-shot prefill. Bitwise: a decode step computes what a prefill of the
// same tokens computes (law 5, phase invariance).
inline void expect_scores_match_reference(const model::Model& model, const Outputs& outputs) {
  backend::CacheConfig cache;
  cache.num_kv_blocks = 64;
  auto backend = backend::cpu::make_cpu_backend(model, cache);
  forensics::SequenceRunner runner(*backend, cache);
  for (const auto& [key, sample] : outputs) {
    const std::string what = key.first + " sample " + std::to_string(key.second);
    std::vector<int32_t> tokens = sample.prompt_ids;
    tokens.insert(tokens.end(), sample.ids.begin(), sample.ids.end());
    const int64_t num_top = sample.top_logprobs.empty() ? 0 : int64_t(sample.top_logprobs[0].size());
    const forensics::ScoredSequence scored = runner.score(tokens, num_top, "the sequence");
    const size_t num_prompt = sample.prompt_ids.size();
    for (size_t i = 0; i < sample.ids.size(); ++i) {
      ASSERT_TRUE(scored.logprobs[num_prompt + i]) << what << " token " << i;
      EXPECT_EQ(*scored.logprobs[num_prompt + i], sample.logprobs[i]) << what << " token " << i;
      if (num_top > 0) {
        const std::vector<backend::TokenLogprob>& want = scored.top_logprobs[num_prompt + i];
        ASSERT_EQ(want.size(), sample.top_logprobs[i].size()) << what << " token " << i;
        for (size_t k = 0; k < want.size(); ++k) {
          EXPECT_EQ(want[k].token, sample.top_logprobs[i][k].token) << what << " token " << i << " rank " << k;
          EXPECT_EQ(want[k].logprob, sample.top_logprobs[i][k].logprob) << what << " token " << i << " rank " << k;
        }
      }
    }
    if (!sample.prompt_logprobs.empty()) {
      const std::vector<std::optional<double>> want(scored.logprobs.begin(), scored.logprobs.begin() + num_prompt);
      EXPECT_EQ(want, sample.prompt_logprobs) << what << " prompt logprobs";
    }
  }
}

// Each request run alone, in an engine of its own: its whole prompt in one step (a one-shot prefill), slot 0, every
// logprob checked against the reference scoring. The engine's batched runs must equal these bitwise (law 5).
inline Outputs run_alone(const model::Model& model, const std::vector<engine::RequestSpec>& specs) {
  Outputs outputs;
  for (const engine::RequestSpec& spec : specs) {
    const int64_t num_tokens = int64_t(spec.prompt_ids.size()) + spec.stop.max_tokens;
    engine::EngineOptions options =
        exact_engine_options(model, spec.n, spec.n * backend::kv_blocks_for(num_tokens, 16), 16, num_tokens);
    options.max_num_batched_tokens = std::max<int64_t>(int64_t(spec.prompt_ids.size()), spec.n);
    engine::Engine engine(model, nullptr, options);
    outputs.merge(run_to_end(engine, {spec}));
  }
  expect_scores_match_reference(model, outputs);
  return outputs;
}

inline void expect_same_top(const std::vector<std::vector<backend::TokenLogprob>>& expected,
                            const std::vector<std::vector<backend::TokenLogprob>>& actual, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t p = 0; p < expected.size(); ++p) {
    ASSERT_EQ(expected[p].size(), actual[p].size()) << what << " position " << p;
    for (size_t k = 0; k < expected[p].size(); ++k) {
      EXPECT_EQ(expected[p][k].token, actual[p][k].token) << what << " position " << p << " rank " << k;
      EXPECT_EQ(expected[p][k].logprob, actual[p][k].logprob) << what << " position " << p << " rank " << k;
    }
  }
}

// Bitwise: ids, logprobs, top logprobs, prompt logprobs and finish reasons (laws 4 and 5).
inline void expect_bitwise_equal(const Outputs& expected, const Outputs& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [key, want] : expected) {
    const std::string what = key.first + " sample " + std::to_string(key.second);
    ASSERT_TRUE(actual.count(key)) << what << " is missing";
    const engine::SampleOutput& got = actual.at(key);
    EXPECT_EQ(want.ids, got.ids) << what;
    EXPECT_EQ(want.logprobs, got.logprobs) << what;  // doubles compared with ==: bitwise
    EXPECT_EQ(want.finish_reason, got.finish_reason) << what;
    expect_same_top(want.top_logprobs, got.top_logprobs, what + " top logprobs");
    EXPECT_EQ(want.prompt_logprobs, got.prompt_logprobs) << what << " prompt logprobs";
    expect_same_top(want.prompt_top_logprobs, got.prompt_top_logprobs, what + " prompt top logprobs");
  }
}

}  // namespace jambo::testing
