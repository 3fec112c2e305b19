// The engine on the CUDA backend with the invariant GEMMs (--cuda-gemm invariant), in the bf16 and the f32 weight
// modes, bitwise:
// - batch invariance: every request's tokens and logprobs (sampled, top and prompt ones) are the same bits run
//   alone (max-num-seqs n) as among all the others, under token budgets that cut prompts into chunks anywhere;
// - phase invariance: each generated token's logprob is the same bits as the prompt logprob a one-shot prefill of
//   the same tokens gives it.
// The prompts run to 300 tokens and some generations past attention's split boundaries (kAttentionSplitKeys), so
// that queries fold several splits in a prefill and in a decode step. Dense and MoE models, MQA and GQA. And the CPU
// engine's settings (support/engine_settings.h: budgets of 1 to all tokens, 1 to 64 sequences, preemption forced,
// each slot policy) over 64 requests, in the bf16 mode; and some of them, with a budget of 4,096 tokens and 256
// sequences at once, at the Reasoning-3B shape, whose GEMMs take the launches of production sizes.
#include "support/engine_settings.h"
#include "backend/cuda/device_rows.h"
#include "cuda_test_util.h"
#include "engine_cases.h"

#include <map>
#include <tuple>
#include <utility>

namespace jambo::testing {
namespace {

constexpr int64_t kKvBlockSize = 16, kMaxModelLen = 512;

struct Batching {
  int64_t max_num_seqs, max_num_batched_tokens;
};

Outputs run_engine(const model::Model& model, engine::CudaWeights weights,
                   const std::vector<engine::RequestSpec>& specs, Batching batching) {
  const int64_t num_kv_blocks = batching.max_num_seqs * (kMaxModelLen / kKvBlockSize);
  engine::EngineOptions options = exact_engine_options(model, batching.max_num_seqs, num_kv_blocks, kKvBlockSize,
                                                       kMaxModelLen, engine::BackendKind::Cuda);
  options.backend.cuda_weights = weights;
  options.backend.cuda_gemm = engine::CudaGemm::Invariant;
  options.memory_budget = {
      .bytes = engine::exact_memory_budget(
          model.config, engine::backend_weight_bytes(engine::BackendKind::Cuda, model, weights),
          batching.max_num_seqs, num_kv_blocks, kKvBlockSize, DType::F32)};
  options.max_num_batched_tokens = batching.max_num_batched_tokens;
  engine::Engine engine(model, nullptr, options);
  return run_to_end(engine, specs);
}

// Every request in an engine of its own, its whole prompt in one step.
Outputs run_alone(const model::Model& model, engine::CudaWeights weights,
                  const std::vector<engine::RequestSpec>& specs) {
  Outputs outputs;
  for (const engine::RequestSpec& spec : specs)
    outputs.merge(
        run_engine(model, weights, {spec}, {spec.n, std::max<int64_t>(int64_t(spec.prompt_ids.size()), spec.n)}));
  return outputs;
}

// Each sample's prompt and tokens scored in one prefill: its tokens' prompt logprobs are its logprobs.
void expect_prefill_equals_decode(const model::Model& model, engine::CudaWeights weights, const Outputs& outputs) {
  std::vector<engine::RequestSpec> scores;
  for (const auto& [key, sample] : outputs) {
    engine::RequestSpec spec;
    spec.id = key.first + "/" + std::to_string(key.second);
    spec.prompt_ids = sample.prompt_ids;
    spec.prompt_ids.insert(spec.prompt_ids.end(), sample.ids.begin(), sample.ids.end());
    spec.stop.max_tokens = 1;
    spec.num_prompt_logprobs = 1;
    scores.push_back(spec);
  }
  const Outputs scored = run_alone(model, weights, scores);
  int64_t num_compared = 0;
  for (const auto& [key, sample] : outputs) {
    const engine::SampleOutput& score = scored.at({key.first + "/" + std::to_string(key.second), 0});
    for (size_t i = 0; i < sample.ids.size(); ++i) {
      const std::optional<double>& prefill = score.prompt_logprobs.at(sample.prompt_ids.size() + i);
      ASSERT_TRUE(prefill.has_value());
      ASSERT_EQ(*prefill, sample.logprobs[i])  // doubles compared with ==: bitwise
          << key.first << " sample " << key.second << " token " << i << ": decode " << sample.logprobs[i]
          << ", prefill " << *prefill;
      ++num_compared;
    }
  }
  std::printf("[cuda invariance] %lld decode logprobs equal to their prefill's\n",
              static_cast<long long>(num_compared));
}

// Random prompts of up to 300 tokens (some single tokens), greedy and seeded sampled, top and prompt logprobs, n = 2
// forks; every fifth request generates 150 tokens, across a split boundary of its keys.
std::vector<engine::RequestSpec> workload(const model::Model& model, uint64_t seed) {
  std::vector<engine::RequestSpec> specs = random_workload(model, 20, seed, /*max_prompt=*/300, /*allow_n=*/false);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].n = i % 4 == 1 ? 2 : 1;
    if (i % 5 == 3) {
      specs[i].stop.max_tokens = 150;
      specs[i].stop.ignore_eos = true;
    }
  }
  return specs;
}

class CudaEngineInvarianceTest : public GpuParamTest<EngineCase> {};

TEST_P(CudaEngineInvarianceTest, ARequestsLogprobsAreItsOwnAndPrefillEqualsDecode) {
  static_assert(backend::cuda::kAttentionSplitKeys < 300, "prompts and generations cross a split boundary");
  const auto& [name, weights] = GetParam();
  const model::Model model = load_case_model(name);
  const std::vector<engine::RequestSpec> specs = workload(model, 17);
  const Outputs alone = run_alone(model, weights, specs);
  for (const Batching batching : {Batching{8, 7}, Batching{64, 64}, Batching{20, 512}}) {
    const std::string what = "max_num_seqs " + std::to_string(batching.max_num_seqs) + ", max_num_batched_tokens " +
                             std::to_string(batching.max_num_batched_tokens);
    SCOPED_TRACE(what);
    expect_bitwise_equal(alone, run_engine(model, weights, specs, batching));
    if (HasFailure()) return;
  }
  expect_prefill_equals_decode(model, weights, alone);
}

// Every request alone against the 64 under each of the CPU engine's settings, on the CUDA backend in the bf16 mode.
class CudaEngineSettingsTest : public GpuParamTest<std::tuple<std::string, EngineSetting>> {};

TEST_P(CudaEngineSettingsTest, EveryRequestMatchesItsRunAlone) {
  const auto& [name, setting] = GetParam();
  const model::Model model = load_case_model(name);
  const std::vector<engine::RequestSpec> specs =
      random_workload(model, kSettingNumRequests, /*seed=*/7, 40, setting.allow_n);
  const TestTraceFile trace;
  engine::EngineOptions options = setting_options(
      model, setting, engine::BackendKind::Cuda,
      engine::backend_weight_bytes(engine::BackendKind::Cuda, model, engine::CudaWeights::Bf16), trace.path());
  options.backend.cuda_weights = engine::CudaWeights::Bf16;
  options.backend.cuda_gemm = engine::CudaGemm::Invariant;
  engine::Engine engine(model, nullptr, options);
  const Outputs outputs = run_to_end(engine, specs);
  // The runs alone depend on the model and the workload only: made once for the settings that share them.
  static std::map<std::pair<std::string, bool>, Outputs> alone_runs;
  const auto [alone, made] = alone_runs.try_emplace({name, setting.allow_n});
  if (made) alone->second = run_alone(model, engine::CudaWeights::Bf16, specs);
  expect_bitwise_equal(alone->second, outputs);
  expect_setting_held(setting, engine.counters(), trace.path());
}

// "jambo_demo_budget_7": a test name of the model and setting.
std::string setting_case_name(const ::testing::TestParamInfo<std::tuple<std::string, EngineSetting>>& info) {
  std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Settings, CudaEngineSettingsTest,
    ::testing::Combine(::testing::Values(std::string("jambo-demo"), std::string("moe-top1-mqa-tied-bf16")),
                       ::testing::ValuesIn(engine_settings())),
    setting_case_name);

// The Reasoning-3B shape under the settings that stretch its steps most: a budget of 7 tokens, 4,096 with up to 256
// sequences in a step (the 112 samples of the workload at once), preemption forced, random slots.
std::vector<EngineSetting> settings_3b() {
  std::vector<EngineSetting> settings;
  for (const EngineSetting& setting : engine_settings())
    if (setting.name == "budget_7" || setting.name == "preemption" || setting.name == "random_slots")
      settings.push_back(setting);
  settings.push_back(EngineSetting{.name = "budget_4096_seqs_256", .max_num_batched_tokens = 4096,
                                   .max_num_seqs = 256});
  return settings;
}

// A setting renamed in engine_settings() must not drop out of the 3B cases unseen.
TEST(CudaEngineSettings3B, TakesItsFourSettings) { EXPECT_EQ(settings_3b().size(), 4u); }

INSTANTIATE_TEST_SUITE_P(
    Settings3B, CudaEngineSettingsTest,
    ::testing::Combine(::testing::Values(std::string("reasoning-3b")), ::testing::ValuesIn(settings_3b())),
    setting_case_name);

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineInvarianceTest,
                         ::testing::Values(EngineCase{"jambo-demo", engine::CudaWeights::Bf16},
                                           EngineCase{"moe-top1-mqa-tied-bf16", engine::CudaWeights::Bf16},
                                           EngineCase{"attn-heavy-tied-bf16", engine::CudaWeights::Bf16},
                                           EngineCase{"jambo-demo", engine::CudaWeights::F32},
                                           EngineCase{"moe-top1-mqa-tied-bf16", engine::CudaWeights::F32}),
                         engine_case_name);

}  // namespace
}  // namespace jambo::testing
