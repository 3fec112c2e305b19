// Random weights generated on the GPU (a model from describe_random_model, which has no host data) against the
// same weights filled on the host and uploaded: every weight allocation bitwise equal in both weight modes, for
// every test model (f32, bf16 and f16 random weights) and the Jamba-Reasoning-3B shape, and forwards on the two
// bitwise equal too.
#include "support/sequences.h"
#include "support/test_models.h"
#include "backend/cuda/device_weights.h"
#include "cuda_test_util.h"
#include "model/config.h"

#include <cuda_runtime_api.h>

#include <cstring>

namespace jambo::testing {
namespace {

using backend::cuda::DeviceWeights;
using backend::cuda::WeightMode;

constexpr uint64_t kSeed = 42;

// Each allocation of `actual` holds exactly the bytes of the same allocation of `expected`.
void expect_same_device_bytes(const backend::cuda::DeviceWeights& expected, const backend::cuda::DeviceWeights& actual,
                              const std::string& name) {
  const std::vector<backend::cuda::DeviceWeights::Allocation> left = expected.allocations(),
                                                              right = actual.allocations();
  ASSERT_EQ(left.size(), right.size()) << name;
  EXPECT_EQ(expected.bytes_on_device, actual.bytes_on_device) << name;
  std::vector<std::byte> host_left, host_right;
  for (size_t i = 0; i < left.size(); ++i) {
    ASSERT_EQ(left[i].num_bytes, right[i].num_bytes) << name << ": allocation " << i;
    host_left.resize(size_t(left[i].num_bytes));
    host_right.resize(size_t(right[i].num_bytes));
    ASSERT_EQ(cudaMemcpy(host_left.data(), left[i].data, host_left.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host_right.data(), right[i].data, host_right.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(host_left.data(), host_right.data(), host_left.size()), 0)
        << name << ": allocation " << i << " of " << left[i].num_bytes << " bytes differs";
  }
}

void expect_gpu_fill_equals_host_fill(const model::JambaConfig& config, DType dtype, backend::cuda::WeightMode mode,
                                      const std::string& name) {
  const model::Model host = make_random_model(config, dtype, kSeed);
  const model::Model described = describe_random_model(config, dtype, kSeed);
  const backend::cuda::DeviceWeights uploaded(host, mode, nullptr);
  const backend::cuda::DeviceWeights generated(described, mode, nullptr);
  expect_same_device_bytes(uploaded, generated, name);
}

class RandomFillTest : public GpuParamTest<TestModelSpec> {};

TEST_P(RandomFillTest, GpuFillEqualsHostFillBitwise) {
  const TestModelSpec& spec = GetParam();
  expect_gpu_fill_equals_host_fill(spec.config, spec.dtype, backend::cuda::WeightMode::F32, spec.name + " (f32 mode)");
  expect_gpu_fill_equals_host_fill(spec.config, spec.dtype, backend::cuda::WeightMode::Bf16,
                                   spec.name + " (bf16 mode)");
}

// Prefill of two sequences (one in two chunks), then decodes: every position's logits bitwise equal.
TEST_P(RandomFillTest, ForwardOnGpuFilledWeightsEqualsHostFilled) {
  const TestModelSpec& spec = GetParam();
  const model::Model host = make_random_model(spec.config, spec.dtype, kSeed);
  const model::Model described = describe_random_model(spec.config, spec.dtype, kSeed);
  for (const std::string weights : {"f32", "bf16"}) {
    auto run = [&](const model::Model& model) {
      auto backend = backend::cuda::make_cuda_backend(model, test_cache(2), weights);
      Sequence first(0, random_tokens(14, spec.config.vocab_size, 3));
      Sequence second(1, random_tokens(14, spec.config.vocab_size, 4));
      std::vector<Logits> logits(2);
      step(*backend, {&first, &second}, {5, 12}, {&logits[0], &logits[1]});
      step(*backend, {&first, &second}, {8, 1}, {&logits[0], &logits[1]});
      step(*backend, {&first, &second}, {1, 1}, {&logits[0], &logits[1]});
      return logits;
    };
    const std::vector<Logits> expected = run(host), actual = run(described);
    for (size_t s = 0; s < expected.size(); ++s) {
      ASSERT_EQ(expected[s].size(), actual[s].size());
      for (size_t p = 0; p < expected[s].size(); ++p)
        EXPECT_EQ(expected[s][p], actual[s][p])
            << spec.name << " (" << weights << "): sequence " << s << ", position " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TestModels, RandomFillTest, ::testing::ValuesIn(test_model_specs()), spec_name);

class RandomFillShapeTest : public GpuTest {};

// The Jamba-Reasoning-3B shape in bf16, as bench/gpu.sh runs it: tensors of up to 168M elements, so the
// fill's grid-stride loop takes several turns.
TEST_F(RandomFillShapeTest, ReasoningThreeBShapeEqualsHostFillBitwise) {
  expect_gpu_fill_equals_host_fill(reasoning_3b_config(), DType::BF16, backend::cuda::WeightMode::Bf16,
                                   "Reasoning-3B shape");
}

// Memory plans count the bytes the CUDA backend will hold without a GPU: the same for a model without host data.
TEST(RandomFillWeightBytes, DescribedModelCountsAsTheHostModel) {
  for (const TestModelSpec& spec : test_model_specs()) {
    const model::Model host = make_random_model(spec.config, spec.dtype, kSeed);
    const model::Model described = describe_random_model(spec.config, spec.dtype, kSeed);
    for (const char* weights : {"f32", "bf16"})
      EXPECT_EQ(backend::cuda::cuda_weight_bytes(described, weights), backend::cuda::cuda_weight_bytes(host, weights))
          << spec.name << " " << weights;
  }
}

}  // namespace
}  // namespace jambo::testing
