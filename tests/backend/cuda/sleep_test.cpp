// Engine::sleep and wake_up on the CUDA backend: asleep, the GPU has the weights' and the caches' memory back (the
// Reasoning-3B shape's 5.4 GiB of bf16 weights and its KV cache); woken, the engine serves bit for bit as before: at
// level 1 the weights it slept with (an update's), at level 2 the checkpoint's, read again. The decode graphs are
// recorded again over the new buffers.
#include "model/checkpoint_builder.h"
#include "model/weight_update.h"
#include "support/engine_test_util.h"
#include "cuda_test_util.h"

#include <chrono>
#include <filesystem>
#include <string>

namespace jambo::testing {
namespace {

using backend::SleepLevel;

constexpr int64_t kMaxNumSeqs = 8, kKvBlockSize = 16, kMaxModelLen = 64;

engine::EngineOptions bf16_options(const model::Model& model, int64_t max_num_seqs, int64_t num_kv_blocks,
                                   int64_t max_model_len) {
  engine::EngineOptions options =
      exact_engine_options(model, max_num_seqs, num_kv_blocks, kKvBlockSize, max_model_len, engine::BackendKind::Cuda);
  options.backend.cuda_weights = engine::CudaWeights::Bf16;
  options.memory_budget = {.bytes = engine::exact_memory_budget(
                               model.config, engine::backend_weight_bytes(engine::BackendKind::Cuda, model,
                                                                          engine::CudaWeights::Bf16),
                               max_num_seqs, num_kv_blocks, kKvBlockSize, DType::F32)};
  return options;
}

class CudaSleepTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    serving_ = load_fixture_model("moe-top1-mqa-tied-bf16");
    other_ = model::make_random_model(serving_.config, DType::BF16, /*seed=*/5);
    specs_ = random_workload(serving_, 12, /*seed=*/3, 30);
    options_ = bf16_options(serving_, kMaxNumSeqs, kMaxNumSeqs * kMaxModelLen / kKvBlockSize, kMaxModelLen);
  }

  Outputs serve(engine::Engine& engine, const std::string& suffix = "") const {
    std::vector<engine::RequestSpec> specs = specs_;
    for (engine::RequestSpec& spec : specs) spec.id += suffix;
    return run_to_end(engine, specs);
  }
  Outputs fresh(const model::Model& model) const {
    engine::Engine engine(model, nullptr, options_);
    return serve(engine);
  }

  model::Model serving_, other_;
  std::vector<engine::RequestSpec> specs_;
  engine::EngineOptions options_;
};

int64_t free_gpu_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return int64_t(free);
}

TEST_F(CudaSleepTest, LevelOneKeepsTheUpdatedWeights) {
  const model_test::TempFolder folder;
  model_test::write_safetensors(folder.path() / "model.safetensors", model_test::weight_tensors(other_));
  engine::Engine engine(serving_, nullptr, options_);
  serve(engine, "-before");
  engine.update_weights(model::read_weight_update(folder.path(), serving_), "step-1");
  engine.sleep(SleepLevel::KeepWeights);
  engine.wake_up({.weights = true, .caches = true});
  expect_bitwise_equal(fresh(other_), serve(engine));
}

// The Reasoning-3B shape (random bf16 weights made on the GPU): a level 1 sleep gives back at least the weights and
// the KV cache, and the woken engine gives the same bits. Twice, times shown: the second sleep copies into the host
// memory that the first one page-locked.
TEST_F(CudaSleepTest, LevelOneOfThe3BShapeGivesBackItsWeightsAndCaches) {
  const model::Model model = model::describe_random_model(
      model::load_config(std::filesystem::path(JAMBO_SOURCE_DIR) / "bench/shapes/jamba-reasoning-3b/config.json"),
      DType::BF16, /*seed=*/1);
  constexpr int64_t kSeqs = 64, kLen = 2048;
  engine::Engine engine(model, nullptr, bf16_options(model, kSeqs, kSeqs * kLen / kKvBlockSize, kLen));
  const std::vector<engine::RequestSpec> specs = random_workload(model, 4, /*seed=*/2, 64, /*allow_n=*/false);
  const Outputs before = run_to_end(engine, specs);
  const int64_t weight_bytes =
      engine::backend_weight_bytes(engine::BackendKind::Cuda, model, engine::CudaWeights::Bf16);
  const model::JambaConfig& c = model.config;
  const int64_t kv_bytes = engine.counters().kv_blocks_total * c.num_attention_layers() * 2 * kKvBlockSize *
                           c.num_key_value_heads * c.head_dim * 4;
  for (const int round : {1, 2}) {
    const int64_t awake = free_gpu_bytes();
    const auto started = std::chrono::steady_clock::now();
    engine.sleep(SleepLevel::KeepWeights);
    const auto slept = std::chrono::steady_clock::now();
    const int64_t asleep = free_gpu_bytes();
    engine.wake_up({.weights = true, .caches = true});
    const auto woken = std::chrono::steady_clock::now();
    const double sleep_seconds = std::chrono::duration<double>(slept - started).count();
    std::printf("[cuda sleep] 3B shape, level 1, sleep %d: %.0f MiB given back (weights %.0f MiB, KV cache %.0f MiB), "
                "sleep %.3f s (%.1f GB/s of weights), wake %.3f s\n",
                round, double(asleep - awake) / (1 << 20), double(weight_bytes) / (1 << 20),
                double(kv_bytes) / (1 << 20), sleep_seconds, double(weight_bytes) / sleep_seconds / 1e9,
                std::chrono::duration<double>(woken - slept).count());
    EXPECT_GE(asleep - awake, weight_bytes + kv_bytes) << "sleep " << round;
    EXPECT_LT(free_gpu_bytes(), asleep - weight_bytes) << "sleep " << round;
    const std::string suffix = "-woken-" + std::to_string(round);
    std::vector<engine::RequestSpec> again = specs;
    for (engine::RequestSpec& spec : again) spec.id += suffix;
    Outputs after = run_to_end(engine, again);
    ASSERT_EQ(after.size(), before.size());
    for (auto [key, sample] : before) {
      const engine::SampleOutput& woke = after.at({key.first + suffix, key.second});
      EXPECT_EQ(sample.ids, woke.ids) << key.first << ", sleep " << round;
      EXPECT_EQ(sample.logprobs, woke.logprobs) << key.first << ", sleep " << round;
    }
  }
}

TEST_F(CudaSleepTest, LevelTwoWakesWithTheCheckpointsWeights) {
  const model_test::TempFolder folder;
  model_test::write_safetensors(folder.path() / "model.safetensors", model_test::weight_tensors(other_));
  engine::Engine engine(serving_, nullptr, options_);
  engine.update_weights(model::read_weight_update(folder.path(), serving_), "step-1");
  serve(engine, "-updated");
  engine.sleep(SleepLevel::DropWeights);
  engine.wake_up({.weights = true});
  engine.wake_up({.caches = true});
  expect_bitwise_equal(fresh(serving_), serve(engine));
}

}  // namespace
}  // namespace jambo::testing
