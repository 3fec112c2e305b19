// Prefix caching on the CUDA backend, through the engine, with the invariant GEMMs in the bf16 and f32 weight modes:
// a request that resumes from a cached prefix gives the bits of the same request run cold (alone, on an engine
// without prefix caching, its prompt in one step), under constant eviction and preemption, beside n = 2 forks and
// requests asking for prompt logprobs, in checked mode (every checkpoint's owner and generation verified before its
// copy, evicted ones poisoned with NaN); and a next chat turn resumes after the previous turn's output, which decode
// steps (CUDA graphs) saved.
#include "support/prefix_requests.h"
#include "cuda_test_util.h"
#include "engine_cases.h"

namespace jambo::testing {
namespace {

constexpr int64_t kBlock = 16, kMaxModelLen = 128;  // 8 KV blocks a request: the plan leaves the checkpoints asked

// Exactly these slots, KV blocks and checkpoints on the CUDA backend; no checkpoints: prefix caching off.
engine::EngineOptions cuda_options(const model::Model& model, engine::CudaWeights weights, int64_t max_num_seqs,
                                   int64_t num_kv_blocks, int64_t num_checkpoints) {
  engine::EngineOptions options =
      exact_engine_options(model, max_num_seqs, num_kv_blocks, kBlock, kMaxModelLen, engine::BackendKind::Cuda);
  options.backend.cuda_weights = weights;
  options.backend.cuda_gemm = engine::CudaGemm::Invariant;
  options.memory_budget = {
      .bytes = engine::exact_memory_budget(model.config,
                                           engine::backend_weight_bytes(engine::BackendKind::Cuda, model, weights),
                                           max_num_seqs + num_checkpoints, num_kv_blocks, kBlock, DType::F32)};
  options.enable_prefix_caching = num_checkpoints > 0;
  options.max_num_checkpoints = num_checkpoints;
  options.max_num_batched_tokens = 24;  // prompts in chunks: checkpoints fall inside and at the end of steps
  return options;
}

Outputs run_cold(const model::Model& model, engine::CudaWeights weights,
                 const std::vector<engine::RequestSpec>& specs) {
  Outputs outputs;
  for (const engine::RequestSpec& spec : specs) {
    engine::EngineOptions options = cuda_options(model, weights, spec.n, spec.n * (kMaxModelLen / kBlock), 0);
    options.max_num_batched_tokens = std::max<int64_t>(int64_t(spec.prompt_ids.size()), spec.n);
    engine::Engine engine(model, nullptr, options);
    outputs.merge(run_to_end(engine, {spec}));
  }
  return outputs;
}

class CudaPrefixCacheTest : public GpuParamTest<EngineCase> {};

// 24 requests over 3 shared prefixes, 2 checkpoints and 12 KV blocks: checkpoints and cached blocks are evicted all
// the time and requests preempted.
TEST_P(CudaPrefixCacheTest, UnderEvictionAndPreemptionEveryRequestIsItsColdRun) {
  const auto& [name, weights] = GetParam();
  const model::Model model = load_case_model(name);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 3; ++p) prefixes.push_back(random_tokens(model, 20 + 14 * p, 50 + p));
  std::vector<engine::RequestSpec> specs;
  for (int i = 0; i < 24; ++i) {
    const std::vector<int32_t> prompt = concat(prefixes[i % 3], random_tokens(model, 1 + i % 13, 100 + i));
    engine::RequestSpec spec = prefix_request(fmt::format("r{}", i), prompt, 4 + i % 9, uint64_t(200 + i));
    if (i % 5 == 2) spec.n = 2;
    if (i % 7 == 3) spec.num_prompt_logprobs = 1;
    specs.push_back(spec);
  }
  engine::Engine engine(model, nullptr, cuda_options(model, weights, 6, 12, 2));
  ASSERT_TRUE(engine.counters().prefix_caching) << engine.prefix_caching_status();
  expect_bitwise_equal(run_cold(model, weights, specs), run_to_end(engine, specs));
  const engine::EngineCounters& counters = engine.counters();
  EXPECT_GT(counters.prefix_cache.hit_tokens, 0);
  EXPECT_GT(counters.prefix_cache.checkpoint_evictions, 0);
  EXPECT_GT(counters.preemptions, 0);
  EXPECT_EQ(counters.law_violations, 0);
  EXPECT_EQ(counters.kv_blocks_used + counters.slots_used, 0);
}

// Turn 2 sends turn 1's prompt (50 tokens) and output (30 tokens, 29 of them run) back: it resumes at 64, from the
// checkpoint a decode step saved, and gives its cold run's bits.
TEST_P(CudaPrefixCacheTest, TheNextTurnResumesAfterThePreviousOutput) {
  const auto& [name, weights] = GetParam();
  const model::Model model = load_case_model(name);
  engine::Engine engine(model, nullptr, cuda_options(model, weights, 8, 64, 8));
  const engine::RequestSpec turn1 = prefix_request("turn1", random_tokens(model, 50, 5), 30, 3);
  const Outputs first = run_to_end(engine, {turn1});
  const std::vector<int32_t> history = concat(turn1.prompt_ids, first.at({"turn1", 0}).ids);
  const engine::RequestSpec turn2 = prefix_request("turn2", concat(history, random_tokens(model, 20, 6)), 20, 4);
  Outputs both = first;
  both.merge(run_to_end(engine, {turn2}));
  expect_bitwise_equal(run_cold(model, weights, {turn1, turn2}), both);
  EXPECT_EQ(engine.counters().prefix_cache.hit_tokens, 64);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaPrefixCacheTest,
                         ::testing::Values(EngineCase{"jambo-demo", engine::CudaWeights::Bf16},
                                           EngineCase{"jambo-demo", engine::CudaWeights::F32},
                                           EngineCase{"moe-top1-mqa-tied-bf16", engine::CudaWeights::Bf16}),
                         engine_case_name);

}  // namespace
}  // namespace jambo::testing
