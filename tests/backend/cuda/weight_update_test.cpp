// Engine::update_weights on the CUDA backend, in each weight mode: the new values are written over the old ones on
// the GPU, converted as at load (A_log to -exp(A_log), gate_proj and up_proj into one matrix, a tied embedding into
// lm_head too), so that the engine then serves them bit for bit as an engine loaded from them does, its decode graphs
// included; and an update the mode cannot hold (a value beyond half's range in the f16 mode) is refused before
// anything is written.
#include "model/checkpoint_builder.h"
#include "model/weight_layout.h"
#include "model/weight_update.h"
#include "support/engine_test_util.h"
#include "cuda_test_util.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

namespace jambo::testing {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string fixture;
  engine::CudaWeights weights;
};

engine::EngineOptions options_for(const model::Model& model, engine::CudaWeights weights) {
  engine::EngineOptions options =
      exact_engine_options(model, 8, 8 * 8, 8, 64, engine::BackendKind::Cuda);
  options.backend.cuda_weights = weights;
  options.memory_budget = {.bytes = engine::exact_memory_budget(
                               model.config, engine::backend_weight_bytes(engine::BackendKind::Cuda, model, weights),
                               8, 8 * 8, 8, DType::F32)};
  return options;
}

class CudaWeightUpdateTest : public GpuParamTest<Case> {
 protected:
  void SetUp() override {
    GpuParamTest<Case>::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    serving_ = load_fixture_model(GetParam().fixture);
    other_ = model::make_random_model(serving_.config, serving_.weights.embed_tokens.dtype, /*seed=*/5);
    specs_ = random_workload(serving_, 12, /*seed=*/3, 30);
  }

  Outputs run(const model::Model& model) const {
    engine::Engine engine(model, nullptr, options_for(model, GetParam().weights));
    return run_to_end(engine, specs_);
  }

  // The workload under other ids, run before an update: the decode graphs are captured with the old weights.
  std::vector<engine::RequestSpec> warm_up() const {
    std::vector<engine::RequestSpec> specs = specs_;
    for (engine::RequestSpec& spec : specs) spec.id += "-before";
    return specs;
  }

  // Runs the workload once, puts the update in, and runs it again.
  Outputs run_updated(const model::WeightUpdate& update) const {
    engine::Engine engine(serving_, nullptr, options_for(serving_, GetParam().weights));
    run_to_end(engine, warm_up());
    engine.update_weights(update, "step-1");
    return run_to_end(engine, specs_);
  }

  void write_update(const fs::path& folder, const std::set<std::string>& only = {}) const {
    model_test::write_safetensors(folder / "model.safetensors", model_test::weight_tensors(other_, only));
  }

  model::Model serving_, other_;
  std::vector<engine::RequestSpec> specs_;
};

TEST_P(CudaWeightUpdateTest, AFullUpdateServesTheNewWeightsBitForBit) {
  const model_test::TempFolder folder;
  write_update(folder.path());
  fs::copy_file(fs::path(JAMBO_SOURCE_DIR) / "tests/fixtures/models" / GetParam().fixture / "config.json",
                folder.path() / "config.json");
  const model::WeightUpdate update = model::read_weight_update(folder.path(), serving_);
  const Outputs after = run_updated(update);
  expect_bitwise_equal(run(model::load_model(folder.path())), after);
  EXPECT_NE(run(serving_).begin()->second.logprobs, after.begin()->second.logprobs);
}

// The weights converted on their way to the GPU: an A_log, an up_proj (the lower half of a stacked matrix) and the
// embedding (tied to lm_head in the tied fixtures), with the final norm.
std::set<std::string> converted_weights(const model::Model& model) {
  std::set<std::string> names = {"model.embed_tokens.weight", "model.final_layernorm.weight"};
  model::ModelWeights weights = model.weights;
  bool has_a_log = false, has_up = false;
  for (const model::WeightSlot& slot : model::list_weight_slots(model.config, weights)) {
    if (!has_a_log && slot.name.ends_with("A_log")) has_a_log = names.insert(slot.name).second;
    if (!has_up && slot.name.ends_with("up_proj.weight")) has_up = names.insert(slot.name).second;
  }
  EXPECT_TRUE(has_a_log && has_up);
  return names;
}

TEST_P(CudaWeightUpdateTest, APartialUpdateReplacesItsWeightsAlone) {
  const std::set<std::string> names = converted_weights(serving_);
  const model_test::TempFolder folder;
  write_update(folder.path(), names);
  const model::WeightUpdate update = model::read_weight_update(folder.path(), serving_);
  ASSERT_EQ(update.pieces.size(), names.size());
  expect_bitwise_equal(run(model_test::with_weights_from(serving_, other_, names)), run_updated(update));
}

// In the f16 mode a bf16 value of 10^6 cannot be held: the update is refused naming the tensor, and the engine goes
// on with the old weights bit for bit, the embedding that came before the bad tensor in the update's order included.
TEST_P(CudaWeightUpdateTest, AnUpdateTheModeCannotHoldChangesNothing) {
  if (GetParam().weights != engine::CudaWeights::F16 || other_.weights.embed_tokens.dtype != DType::BF16)
    GTEST_SKIP() << "a refusal of the f16 mode over bf16 weights";
  model::ModelWeights weights = serving_.weights;
  std::string bad;
  for (const model::WeightSlot& slot : model::list_weight_slots(serving_.config, weights))
    if (slot.role == model::WeightRole::Linear && slot.name != "model.embed_tokens.weight") bad = slot.name;
  std::vector<model_test::TestTensor> tensors =
      model_test::weight_tensors(other_, {"model.embed_tokens.weight", bad});
  ASSERT_EQ(tensors.size(), 2u);
  for (model_test::TestTensor& tensor : tensors)
    if (tensor.name == bad) {
      const uint16_t million = 0x4974;  // bf16 of 10^6
      std::memcpy(tensor.bytes.data(), &million, sizeof(million));
    }
  const model_test::TempFolder folder;
  model_test::write_safetensors(folder.path() / "model.safetensors", tensors);
  const model::WeightUpdate update = model::read_weight_update(folder.path(), serving_);

  engine::Engine engine(serving_, nullptr, options_for(serving_, GetParam().weights));
  run_to_end(engine, warm_up());
  try {
    engine.update_weights(update, "too-big");
    FAIL() << "the f16 mode took a value beyond half's range";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("beyond IEEE half's range"), std::string::npos) << error.what();
  }
  expect_bitwise_equal(run(serving_), run_to_end(engine, specs_));
}
INSTANTIATE_TEST_SUITE_P(Modes, CudaWeightUpdateTest,
                         ::testing::Values(Case{"moe-top1-mqa-tied-bf16", engine::CudaWeights::Bf16},
                                           Case{"moe-top1-mqa-tied-bf16", engine::CudaWeights::F16},
                                           Case{"moe-top2-gqa2-fp32", engine::CudaWeights::F32},
                                           Case{"attn-heavy-tied-bf16", engine::CudaWeights::F32}),
                         [](const auto& info) {
                           std::string name = info.param.fixture + "_" +
                                              std::string(engine::name(info.param.weights));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace jambo::testing
