// The CUDA backend split over ranks (make_tensor_parallel_cuda_backend, model/tensor_parallel.h). Without several
// GPUs the ranks share one (same_device_group.h): every fixture split over every rank count it allows gives
// logprobs close to the unsharded CUDA backend's, a row's logits are the same bits alone as beside other rows, and an
// update from a folder serves the new weights bit for bit; random weights generated on the GPU split into the same
// bits as the same weights made on the host.
// The NCCL group sums in rank order on every GPU there is; the rank-order sum kernel equals the host's sum.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_communicator.h"
#include "backend/cuda/same_device_group.h"
#include "backend/cuda/cuda_test_util.h"
#include "engine/backend_factory.h"
#include "model/checkpoint_builder.h"
#include "model/tensor_parallel.h"
#include "model/weight_update.h"
#include "support/tensor_parallel_scenario.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <thread>

namespace jambo::backend::cuda {
namespace {

using testing::Logits;

class TensorParallelCudaTest : public testing::GpuTest {};

std::unique_ptr<Backend> split_backend(const model::Model& model, int64_t size, const std::string& weights) {
  return make_tensor_parallel_cuda_backend(model, testing::test_cache(3), testing::make_same_device_group(size),
                                           weights, /*decode_graphs=*/true, /*invariant_gemm=*/true);
}

// Over every rank count the model can be split over, the largest logprob difference from the unsharded backend
// (the same weight mode, invariant GEMMs) at any position; returns how many rank counts were compared.
int64_t compare_with_unsharded(const std::string& name, const model::Model& model, const std::string& weights,
                               double bound) {
  const int64_t vocab = model.config.vocab_size;
  const std::vector<Logits> whole = testing::run_split_scenario(
      *make_cuda_backend(model, testing::test_cache(3), weights, /*decode_graphs=*/true, /*invariant_gemm=*/true),
      vocab);
  int64_t num_compared = 0;
  for (const int64_t size : {2, 3, 4}) {
    if (!model::tensor_parallel_obstacle(model.config, size).empty()) continue;
    const std::vector<Logits> split = testing::run_split_scenario(*split_backend(model, size, weights), vocab);
    const double worst = testing::max_logprob_difference(split, whole);
    std::printf("[cuda tensor parallel] %s, %s weights, %lld ranks: max |dlogprob| %.3g against one rank\n",
                name.c_str(), weights.c_str(), static_cast<long long>(size), worst);
    EXPECT_LE(worst, bound) << size << " ranks";
    ++num_compared;
  }
  return num_compared;
}

// f32 weights: the ranks' partial sums in another order move a logit by about 1e-6 of the largest (as on the CPU,
// tests/backend/cpu/tensor_parallel_test.cpp); 1e-4 of it bounds that, and an all-reduce left out or done twice moves
// logprobs by whole nats.
TEST_F(TensorParallelCudaTest, F32LogprobsAreCloseToTheUnshardedBackendOnEveryFixture) {
  int64_t num_compared = 0;
  for (const std::string& name : testing::kSplitFixtures) {
    SCOPED_TRACE(name);
    const model::Model model = testing::load_fixture(name);
    const std::vector<Logits> probe = testing::run_split_scenario(
        *make_cuda_backend(model, testing::test_cache(3), "f32", true, true), model.config.vocab_size);
    const double bound = 1e-4 * std::max(1.0, testing::largest_magnitude(probe[0]));
    num_compared += compare_with_unsharded(name, model, "f32", bound);
  }
  EXPECT_GE(num_compared, 12);
}

// bf16 weights: a GEMM's input is rounded to bf16 after the all-reduce, so a sum in another order can move it by
// one bf16 step; held to the bf16 mode's bound against the CPU (forward_test.cpp: kBf16Tolerance).
TEST_F(TensorParallelCudaTest, Bf16LogprobsStayWithinTheBf16BoundOfTheUnshardedBackend) {
  const model::Model model = testing::load_fixture("sharded-gqa4-bf16");
  EXPECT_EQ(compare_with_unsharded("sharded-gqa4-bf16", model, "bf16", 0.25), 2);  // 2 and 4 ranks
}

// Each rank's GEMMs and the all-reduce's order are fixed by the model's shape, never by the batch.
TEST_F(TensorParallelCudaTest, ARowsLogitsAreTheSameBitsAloneAsInABatch) {
  const model::Model model = testing::load_fixture("moe-top2-gqa2-fp32");
  const int64_t vocab = model.config.vocab_size;
  for (const std::string weights : {"f32", "bf16"}) {
    SCOPED_TRACE(weights);
    const auto [by_itself, among_others] = testing::run_alone_and_batched(
        *split_backend(model, 2, weights), *split_backend(model, 2, weights), vocab);
    EXPECT_EQ(by_itself.size(), 15u);
    EXPECT_EQ(by_itself, among_others);
  }
}

// An update from a folder, cut into the ranks' shards (whole, and of a column-sharded x_proj and a replicated norm),
// serves the new weights bit for bit as a split backend loaded from them: each rank finds its weights by the views
// of its shard as loaded. So for a checkpoint and for random weights made on the GPUs (whose column slices an update
// must still cut from its host values).
TEST_F(TensorParallelCudaTest, AnUpdateServesTheNewWeightsBitForBit) {
  const model::Model checkpoint = testing::load_fixture("moe-top2-gqa2-fp32");
  const model::JambaConfig& config = checkpoint.config;
  const model::Model other = model::make_random_model(config, DType::F32, /*seed=*/5);
  const model::Model made = model::make_random_model(config, DType::F32, /*seed=*/9);
  const model::Model described = model::describe_random_model(config, DType::F32, /*seed=*/9);
  struct Serving {
    std::string what;
    const model::Model& loaded;  // what the backend loads
    const model::Model& values;  // the same weights with host data
  };
  const std::set<std::string> some = {"model.final_layernorm.weight", "model.layers.0.mamba.x_proj.weight"};
  for (const Serving& serving : {Serving{"checkpoint", checkpoint, checkpoint},
                                 Serving{"random weights made on the GPU", described, made}})
    for (const std::set<std::string>& names : {std::set<std::string>{}, some}) {
      SCOPED_TRACE(serving.what + (names.empty() ? ", whole" : ", two weights"));
      const model_test::TempFolder folder;
      model_test::write_safetensors(folder.path() / "model.safetensors", model_test::weight_tensors(other, names));
      const model::Model updated = names.empty() ? other : model_test::with_weights_from(serving.values, other, names);
      auto backend = split_backend(serving.loaded, 2, "f32");
      backend->update_weights(model::read_weight_update(folder.path(), serving.loaded));
      EXPECT_EQ(testing::run_split_scenario(*backend, config.vocab_size),
                testing::run_split_scenario(*split_backend(updated, 2, "f32"), config.vocab_size));
    }
}

// A described model (no host data) gives each rank its slices generated on its GPU, from the shard's recipe: the split
// backend serves the same bits as one split from the same random model made on the host (an MoE model with fewer KV
// heads than ranks, and a dense one with more, in both 16-bit and f32 weights).
TEST_F(TensorParallelCudaTest, RandomWeightsMadeOnTheGpusSplitAsTheHostsDo) {
  int64_t num_compared = 0;
  for (const std::string name : {"moe-top1-mqa-tied-bf16", "sharded-gqa4-bf16"}) {
    const model::JambaConfig config = testing::load_fixture(name).config;
    for (const int64_t size : {2, 4}) {
      if (!model::tensor_parallel_obstacle(config, size).empty()) continue;
      for (const std::string weights : {"f32", "bf16"}) {
        SCOPED_TRACE(name + ", " + std::to_string(size) + " ranks, " + weights);
        const model::Model made = model::make_random_model(config, DType::BF16, /*seed=*/3);
        const model::Model described = model::describe_random_model(config, DType::BF16, /*seed=*/3);
        EXPECT_EQ(testing::run_split_scenario(*split_backend(described, size, weights), config.vocab_size),
                  testing::run_split_scenario(*split_backend(made, size, weights), config.vocab_size));
        ++num_compared;
      }
    }
  }
  EXPECT_EQ(num_compared, 8);  // 2 and 4 ranks of each model, in two weight modes
}

TEST_F(TensorParallelCudaTest, SumInRankOrderEqualsTheHostsSumInRankOrder) {
  const int64_t count = 1000, num_parts = 3;
  std::vector<std::vector<float>> host(num_parts);
  std::vector<DeviceBuffer<float>> device;
  RankParts parts;
  parts.num_parts = num_parts;
  for (int64_t r = 0; r < num_parts; ++r) {
    for (int64_t i = 0; i < count; ++i) host[size_t(r)].push_back(float(std::sin(double(i * (r + 3)))) * 1e3f);
    device.push_back(testing::upload(host[size_t(r)].data(), count));
    parts.parts[r] = device.back().data();
  }
  DeviceBuffer<float> sum(count);
  sum_in_rank_order(parts, sum.data(), count, nullptr);
  const std::vector<float> got = testing::download(sum.data(), count);
  for (int64_t i = 0; i < count; ++i) {
    const float expected = (host[0][size_t(i)] + host[1][size_t(i)]) + host[2][size_t(i)];
    ASSERT_EQ(got[size_t(i)], expected) << i;
  }
}

// Every GPU there is, one rank each; on one GPU the group of one, whose sum is the values themselves.
TEST_F(TensorParallelCudaTest, NcclGroupSumsInRankOrderOnEveryGpu) {
  if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  int num_devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&num_devices), cudaSuccess);
  const int64_t size = std::min<int64_t>(num_devices, 8);
  std::printf("[nccl] a group of %lld ranks\n", static_cast<long long>(size));
  std::vector<std::unique_ptr<DeviceCommunicator>> group = make_nccl_group(size);
  const int64_t count = 1001;  // not a multiple of the ranks: the last slice is shorter
  const auto value = [](int64_t rank, int64_t i) { return float(std::cos(double(i + 7 * rank))) * 100.0f; };
  std::vector<DeviceBuffer<float>> buffers(static_cast<size_t>(size));
  std::vector<cudaStream_t> streams(static_cast<size_t>(size));
  for (int64_t r = 0; r < size; ++r) {
    const DeviceScope scope(group[size_t(r)]->device());
    std::vector<float> host;
    for (int64_t i = 0; i < count; ++i) host.push_back(value(r, i));
    buffers[size_t(r)] = testing::upload(host.data(), count);
    ASSERT_EQ(cudaStreamCreate(&streams[size_t(r)]), cudaSuccess);
  }
  // A thread per rank, as the backend runs them: a rank's exchange waits for its peers'.
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      const DeviceScope scope(group[size_t(r)]->device());
      group[size_t(r)]->all_reduce_sum(buffers[size_t(r)].data(), count, streams[size_t(r)]);
      cudaStreamSynchronize(streams[size_t(r)]);
    });
  for (std::thread& thread : threads) thread.join();
  for (int64_t r = 0; r < size; ++r) {
    const DeviceScope scope(group[size_t(r)]->device());
    const std::vector<float> got = testing::download(buffers[size_t(r)].data(), count);
    for (int64_t i = 0; i < count; ++i) {
      float expected = value(0, i);
      for (int64_t other = 1; other < size; ++other) expected += value(other, i);
      ASSERT_EQ(got[size_t(i)], expected) << "rank " << r << " element " << i;
    }
    cudaStreamDestroy(streams[size_t(r)]);
  }
}

// More ranks than GPUs is refused, naming both counts.
TEST_F(TensorParallelCudaTest, MoreRanksThanGpusAreRefused) {
  int num_devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&num_devices), cudaSuccess);
  const model::Model model = testing::load_fixture("sharded-gqa4-bf16");  // splits over 2 and 4 ranks
  engine::BackendChoice choice;
  choice.kind = engine::BackendKind::Cuda;
  choice.tensor_parallel_size = num_devices < 2 ? 2 : 4;
  if (choice.tensor_parallel_size <= num_devices) GTEST_SKIP() << "every split of the model fits the GPUs here";
  try {
    engine::make_backend(choice, model, testing::test_cache(1));
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    const std::string expected =
        nccl_available() ? "GPUs, one each, and " + std::to_string(num_devices) + " are visible" : "needs NCCL";
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace jambo::backend::cuda
