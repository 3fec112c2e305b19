// Laws 4 and 5: every sample's ids and logprobs are bitwise equal between running it alone (one-shot
// prefill, nothing else in the batch) and running it among 64 requests, however the engine is set
// (support/engine_settings.h): token budget, sequences at once, memory so tight that preemption happens, n = 1
// and 4, slot policy. tests/backend/cuda/engine_invariance_test.cpp holds the CUDA backend to the same settings.
#include "support/engine_settings.h"

namespace jambo::testing {
namespace {

class EngineInvarianceTest : public ::testing::TestWithParam<EngineSetting> {
 protected:
  OneThread one_thread_;
  model::Model model_ = load_fixture_model();
};

TEST_P(EngineInvarianceTest, EveryRequestMatchesItsRunAlone) {
  const EngineSetting& setting = GetParam();
  const std::vector<engine::RequestSpec> specs =
      random_workload(model_, kSettingNumRequests, /*seed=*/7, 40, setting.allow_n);
  const TestTraceFile trace;
  const engine::EngineOptions options = setting_options(
      model_, setting, engine::BackendKind::Cpu, engine::backend_weight_bytes(engine::BackendKind::Cpu, model_),
      trace.path());
  engine::Engine engine(model_, nullptr, options);

  const Outputs outputs = run_to_end(engine, specs);
  expect_bitwise_equal(run_alone(model_, specs), outputs);
  expect_setting_held(setting, engine.counters(), trace.path());
}

INSTANTIATE_TEST_SUITE_P(Settings, EngineInvarianceTest, ::testing::ValuesIn(engine_settings()),
                         [](const ::testing::TestParamInfo<EngineSetting>& info) { return info.param.name; });

}  // namespace
}  // namespace jambo::testing
