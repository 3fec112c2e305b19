// Engine::sleep and wake_up on the CPU backend: a sleep at level 1 keeps the weights (an update's too), one at level
// 2 drops them and the wake reads the checkpoint again; either way the woken engine serves bit for bit as before,
// and nothing runs while anything sleeps. Sleep refuses while a request is unfinished, and an update while the
// weights sleep, each changing nothing.
#include "model/checkpoint_builder.h"
#include "model/weight_update.h"
#include "support/engine_test_util.h"

#include <string>

namespace jambo::testing {
namespace {

using backend::SleepLevel;
using backend::WakeTags;

constexpr WakeTags kEverything{.weights = true, .caches = true};

class EngineSleepTest : public ::testing::Test {
 protected:
  // The workload under ids of their own: each run of it in one engine is new requests.
  std::vector<engine::RequestSpec> workload(const std::string& suffix) const {
    std::vector<engine::RequestSpec> specs = specs_;
    for (engine::RequestSpec& spec : specs) spec.id += suffix;
    return specs;
  }
  // What the engine serves now, under the workload's own ids.
  Outputs serve(engine::Engine& engine) const { return run_to_end(engine, specs_); }
  Outputs fresh(const model::Model& model) const {
    engine::Engine engine(model, nullptr, options_);
    return serve(engine);
  }
  // Writes other_'s weights as an update of serving_ and reads it.
  model::WeightUpdate update_to_other() const {
    model_test::write_safetensors(folder_.path() / "model.safetensors", model_test::weight_tensors(other_));
    return model::read_weight_update(folder_.path(), serving_);
  }

  OneThread one_thread_;
  model::Model serving_ = load_fixture_model();
  model::Model other_ = model::make_random_model(serving_.config, DType::F32, /*seed=*/5);
  engine::EngineOptions options_ = exact_engine_options(serving_, 8, 8 * 8, 8, 64);
  std::vector<engine::RequestSpec> specs_ = random_workload(serving_, 12, /*seed=*/3, 30);
  model_test::TempFolder folder_;
};

TEST_F(EngineSleepTest, LevelOneKeepsTheWeightsAnUpdateBrought) {
  engine::Engine engine(serving_, nullptr, options_);
  run_to_end(engine, workload("-before"));
  engine.update_weights(update_to_other(), "step-1");
  engine.sleep(SleepLevel::KeepWeights);
  EXPECT_TRUE(engine.sleeping().weights && engine.sleeping().caches);
  engine.wake_up(kEverything);
  EXPECT_FALSE(engine.sleeping().weights || engine.sleeping().caches);
  expect_bitwise_equal(fresh(other_), serve(engine));
}

TEST_F(EngineSleepTest, LevelTwoWakesWithTheCheckpointsWeights) {
  engine::Engine engine(serving_, nullptr, options_);
  engine.update_weights(update_to_other(), "step-1");
  run_to_end(engine, workload("-updated"));
  engine.sleep(SleepLevel::DropWeights);
  engine.wake_up(kEverything);
  expect_bitwise_equal(fresh(serving_), serve(engine));
}

// Requests taken while asleep wait: a step refuses to run them until both the weights and the caches are awake,
// and then they come out as they would have.
TEST_F(EngineSleepTest, NothingRunsUntilEverythingIsAwake) {
  engine::Engine engine(serving_, nullptr, options_);
  engine.sleep(SleepLevel::KeepWeights);
  for (const engine::RequestSpec& spec : specs_) engine.add_request(spec);
  EXPECT_THROW(engine.step(), Error);
  engine.wake_up({.caches = true});
  EXPECT_THROW(engine.step(), Error);
  EXPECT_THROW(engine.update_weights(update_to_other(), "asleep"), Error);
  engine.wake_up({.weights = true});
  expect_bitwise_equal(fresh(serving_), run_to_end(engine, {}));
}

TEST_F(EngineSleepTest, SleepRefusesWhileARequestIsUnfinished) {
  engine::Engine engine(serving_, nullptr, options_);
  for (const engine::RequestSpec& spec : specs_) engine.add_request(spec);
  Outputs after;
  for (engine::SampleOutput& sample : engine.step()) after[std::pair(sample.id, sample.sample)] = std::move(sample);
  try {
    engine.sleep(SleepLevel::DropWeights);
    FAIL() << "slept with requests under way";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("requests unfinished"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(engine.sleeping().caches);
  after.merge(run_to_end(engine, {}));
  expect_bitwise_equal(fresh(serving_), after);
}

}  // namespace
}  // namespace jambo::testing
