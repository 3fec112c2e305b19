// Engine::update_weights on the CPU backend: after an update the engine serves the new weights bit for bit as an
// engine loaded from them does, whole or in part, and the update copies them: the folder may change after.
#include "model/checkpoint_builder.h"
#include "model/weight_layout.h"
#include "model/weight_update.h"
#include "support/engine_test_util.h"

#include <filesystem>
#include <set>

namespace jambo::testing {
namespace {

namespace fs = std::filesystem;

void write_weights(const model::Model& model, const fs::path& folder, const std::set<std::string>& only = {}) {
  model_test::write_safetensors(folder / "model.safetensors", model_test::weight_tensors(model, only));
}

engine::EngineOptions options_for(const model::Model& model) {
  return exact_engine_options(model, 8, 8 * 8, 8, 64);
}

Outputs run(const model::Model& model, const std::vector<engine::RequestSpec>& specs) {
  engine::Engine engine(model, nullptr, options_for(model));
  return run_to_end(engine, specs);
}

fs::path fixture_folder() { return fs::path(JAMBO_SOURCE_DIR) / "tests/fixtures/models/moe-top2-gqa2-fp32"; }

class WeightUpdateTest : public ::testing::Test {
 protected:
  OneThread one_thread_;
  model::Model serving_ = model::load_model(fixture_folder());
  // The same architecture with other values (fp32, as the fixture's).
  model::Model other_ = model::make_random_model(serving_.config, DType::F32, /*seed=*/5);
  std::vector<engine::RequestSpec> specs_ = random_workload(serving_, 12, /*seed=*/3, 30);
};

TEST_F(WeightUpdateTest, AFullUpdateServesTheNewWeightsBitForBit) {
  const model_test::TempFolder folder;
  write_weights(other_, folder.path());
  fs::copy_file(fixture_folder() / "config.json", folder.path() / "config.json");
  const model::Model loaded = model::load_model(folder.path());

  engine::Engine engine(serving_, nullptr, options_for(serving_));
  const Outputs before = run_to_end(engine, specs_);
  {
    const model::WeightUpdate update = model::read_weight_update(folder.path(), serving_);
    EXPECT_EQ(update.pieces.size(), model::list_weight_slots(serving_.config, serving_.weights).size());
    engine.update_weights(update, "step-1");
  }
  fs::remove_all(folder.path());  // the backend holds a copy
  EXPECT_EQ(engine.weight_version(), "step-1");
  std::vector<engine::RequestSpec> again = specs_;
  for (engine::RequestSpec& spec : again) spec.id += "-again";
  const Outputs after = run_to_end(engine, again);

  expect_bitwise_equal(run(loaded, again), after);
  for (const auto& [key, sample] : after) {
    ASSERT_EQ(sample.weight_versions.size(), 1u);
    EXPECT_EQ(sample.weight_versions[0].version, "step-1");
  }
  // The new weights changed what the engine computes.
  const auto& [first_key, first_before] = *before.begin();
  EXPECT_NE(first_before.logprobs, after.at({first_key.first + "-again", first_key.second}).logprobs);
}

// Over 2 tensor-parallel ranks, an update is cut into the ranks' shards: whole, or of a row-sharded matrix, a
// column-sharded one, in_proj's u and z parts and a replicated norm, the engine then equals a tensor-parallel engine
// loaded from the new weights, bit for bit.
TEST_F(WeightUpdateTest, UnderTensorParallelismAnUpdateServesTheNewWeightsBitForBit) {
  const auto tensor_parallel = [](const model::Model& model) {
    engine::EngineOptions options = options_for(model);
    options.backend.tensor_parallel_size = 2;
    return options;
  };
  const std::set<std::string> some = {"model.final_layernorm.weight", "model.layers.0.mamba.in_proj.weight",
                                      "model.layers.0.mamba.x_proj.weight", "model.layers.0.mamba.dt_proj.weight"};
  for (const std::set<std::string>& names : {std::set<std::string>{}, some}) {
    const model_test::TempFolder folder;
    write_weights(other_, folder.path(), names);
    const model::Model updated = names.empty() ? other_ : model_test::with_weights_from(serving_, other_, names);
    engine::Engine engine(serving_, nullptr, tensor_parallel(serving_));
    engine.update_weights(model::read_weight_update(folder.path(), serving_), "step-1");
    engine::Engine loaded(updated, nullptr, tensor_parallel(updated));
    expect_bitwise_equal(run_to_end(loaded, specs_), run_to_end(engine, specs_));
  }
}

// An update of two weights leaves the others as they were: the engine equals one loaded from the serving
// checkpoint with those two replaced.
TEST_F(WeightUpdateTest, APartialUpdateReplacesItsWeightsAlone) {
  const std::set<std::string> names = {"model.final_layernorm.weight", "model.layers.0.mamba.in_proj.weight"};
  const model_test::TempFolder update_folder;
  write_weights(other_, update_folder.path(), names);
  const model::Model mixed = model_test::with_weights_from(serving_, other_, names);

  engine::Engine engine(serving_, nullptr, options_for(serving_));
  const model::WeightUpdate update = model::read_weight_update(update_folder.path(), serving_);
  EXPECT_EQ(update.pieces.size(), names.size());
  engine.update_weights(update, "partial");
  const Outputs after = run_to_end(engine, specs_);
  expect_bitwise_equal(run(mixed, specs_), after);
}

}  // namespace
}  // namespace jambo::testing
