// Engine::sleep and wake_up on the CUDA backend: asleep, the GPU has the caches' memory back (a KV cache of 1 GiB
// here) and the weights' too; woken, the engine serves bit for bit as before: at level 1 the weights it slept with (an
// update's), at level 2 the checkpoint's, read again. The decode graphs are recorded again over the new buffers.
#include "model/checkpoint_builder.h"
#include "model/weight_update.h"
#include "support/engine_test_util.h"
#include "cuda_test_util.h"

#include <string>

namespace jambo::testing {
namespace {

using backend::SleepLevel;

constexpr int64_t kMaxNumSeqs = 8, kKvBlockSize = 16, kMaxModelLen = 64;
constexpr int64_t kKvCacheBytes = int64_t(1) << 30;

class CudaSleepTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    serving_ = load_fixture_model("moe-top1-mqa-tied-bf16");
    other_ = model::make_random_model(serving_.config, DType::BF16, /*seed=*/5);
    specs_ = random_workload(serving_, 12, /*seed=*/3, 30);
    const model::JambaConfig& c = serving_.config;
    const int64_t block_bytes = c.num_attention_layers() * 2 * kKvBlockSize * c.num_key_value_heads * c.head_dim * 4;
    const int64_t num_kv_blocks = kKvCacheBytes / block_bytes;
    options_ = exact_engine_options(serving_, kMaxNumSeqs, num_kv_blocks, kKvBlockSize, kMaxModelLen,
                                    engine::BackendKind::Cuda);
    options_.backend.cuda_weights = engine::CudaWeights::Bf16;
    options_.memory_budget = {.bytes = engine::exact_memory_budget(
                                  c, engine::backend_weight_bytes(engine::BackendKind::Cuda, serving_,
                                                                  engine::CudaWeights::Bf16),
                                  kMaxNumSeqs, num_kv_blocks, kKvBlockSize, DType::F32)};
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

void expect_same_tokens(Outputs expected, const Outputs& actual) {
  for (auto& [key, sample] : expected) sample.weight_versions = actual.at(key).weight_versions;
  expect_bitwise_equal(expected, actual);
}

TEST_F(CudaSleepTest, LevelOneGivesTheMemoryBackAndKeepsTheUpdatedWeights) {
  const model_test::TempFolder folder;
  model_test::write_safetensors(folder.path() / "model.safetensors", model_test::weight_tensors(other_));
  engine::Engine engine(serving_, nullptr, options_);
  serve(engine, "-before");
  engine.update_weights(model::read_weight_update(folder.path(), serving_), "step-1");
  const int64_t awake = free_gpu_bytes();
  engine.sleep(SleepLevel::KeepWeights);
  const int64_t asleep = free_gpu_bytes();
  std::printf("[cuda sleep] level 1 gave back %.1f MiB\n", double(asleep - awake) / (1 << 20));
  EXPECT_GE(asleep - awake, kKvCacheBytes);
  engine.wake_up({.weights = true, .caches = true});
  EXPECT_LT(free_gpu_bytes(), asleep - kKvCacheBytes / 2);
  expect_same_tokens(fresh(other_), serve(engine));
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
  expect_same_tokens(fresh(serving_), serve(engine));
}

}  // namespace
}  // namespace jambo::testing
