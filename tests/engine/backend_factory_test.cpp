// Parsing the backend flags' values (every spelling, and a bad one refused by name with the valid ones listed), and
// make_backend's guard: the CPU backend reads weights from host memory, so a model whose random weights are only
// described (for the GPU to generate) is refused with a message saying so, before any read.
#include "engine/backend_factory.h"
#include "model/tensor_parallel.h"
#include "support/sequences.h"
#include "support/test_models.h"

namespace jambo::testing {
namespace {

// The error names the bad value and lists every valid spelling.
template <typename Parse>
void expect_refused(Parse parse, const std::string& text, const std::vector<std::string_view>& valid) {
  try {
    parse(text);
    ADD_FAILURE() << "'" << text << "' was accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'" + text + "'"), std::string::npos) << message;
    for (const std::string_view name : valid) EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

TEST(BackendFactory, ParsesEveryBackendOfThisBuild) {
  EXPECT_EQ(engine::parse_backend_kind("cpu"), engine::BackendKind::Cpu);
#ifdef JAMBO_WITH_CUDA
  EXPECT_EQ(engine::parse_backend_kind("cuda"), engine::BackendKind::Cuda);
  EXPECT_EQ(engine::backend_names(), (std::vector<std::string_view>{"cpu", "cuda"}));
#else
  EXPECT_EQ(engine::backend_names(), (std::vector<std::string_view>{"cpu"}));
  expect_refused(engine::parse_backend_kind, "cuda", {"not in this build", "cpu", "nvcc"});
#endif
  expect_refused(engine::parse_backend_kind, "tpu", engine::backend_names());
  expect_refused(engine::parse_backend_kind, "CPU", engine::backend_names());
}

TEST(BackendFactory, ParsesEveryWeightModeAndStateDtype) {
  EXPECT_EQ(engine::parse_cuda_weights("f32"), engine::CudaWeights::F32);
  EXPECT_EQ(engine::parse_cuda_weights("bf16"), engine::CudaWeights::Bf16);
  EXPECT_EQ(engine::parse_cuda_weights("f16"), engine::CudaWeights::F16);
  EXPECT_EQ(engine::cuda_weights_names(), (std::vector<std::string_view>{"f32", "bf16", "f16"}));
  expect_refused(engine::parse_cuda_weights, "fp8", engine::cuda_weights_names());

  EXPECT_EQ(engine::parse_state_dtype("f32"), DType::F32);
  EXPECT_EQ(engine::parse_state_dtype("bf16"), DType::BF16);
  EXPECT_EQ(engine::state_dtype_names(), (std::vector<std::string_view>{"f32", "bf16"}));
  expect_refused(engine::parse_state_dtype, "f16", engine::state_dtype_names());
}

// name() spells each value as its flag takes it.
TEST(BackendFactory, NamesParseBack) {
  for (const engine::BackendKind kind : engine::available_backends())
    EXPECT_EQ(engine::parse_backend_kind(std::string(name(kind))), kind);
  for (const engine::CudaWeights weights :
       {engine::CudaWeights::F32, engine::CudaWeights::Bf16, engine::CudaWeights::F16})
    EXPECT_EQ(engine::parse_cuda_weights(std::string(engine::name(weights))), weights);
  for (const DType dtype : {DType::F32, DType::BF16})
    EXPECT_EQ(engine::parse_state_dtype(std::string(engine::state_dtype_name(dtype))), dtype);
}

TEST(BackendFactory, CpuBackendRefusesAModelWithoutHostData) {
  const model::Model described = describe_random_model(small_config(), DType::BF16, 5);
  try {
    engine::make_backend({.kind = engine::BackendKind::Cpu}, described, test_cache(1));
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the CPU backend reads the weights from host memory"), std::string::npos)
        << error.what();
  }
  // Counting the bytes a backend holds reads no weights: it works on a described model.
  EXPECT_EQ(engine::backend_weight_bytes(engine::BackendKind::Cpu, described),
            make_random_model(small_config(), DType::BF16, 5).weights.bytes_total);
}

#ifdef JAMBO_WITH_CUDA
// A memory plan of a split CUDA backend sizes rank 0's shard (its shapes, nothing copied) as loaded; a described model
// (random weights made on the GPUs) splits as the same model made on the host does.
TEST(BackendFactory, TheMemoryShareOfASplitCudaBackendNeedsNoHostData) {
  const engine::BackendChoice split{.kind = engine::BackendKind::Cuda, .tensor_parallel_size = 2};
  const model::Model whole = make_random_model(small_config(), DType::BF16, 5);
  const engine::MemoryShare made = engine::memory_share(split, whole);
  const engine::MemoryShare described =
      engine::memory_share(split, describe_random_model(small_config(), DType::BF16, 5));
  EXPECT_EQ(made.weight_bytes,
            engine::backend_weight_bytes(engine::BackendKind::Cuda, model::shard_model(whole, 0, 2)));
  EXPECT_EQ(described.weight_bytes, made.weight_bytes);
  EXPECT_EQ(described.config.mamba_d_inner, made.config.mamba_d_inner);
  EXPECT_EQ(made.config.mamba_d_inner * 2, whole.config.mamba_d_inner);
  EXPECT_LT(made.weight_bytes, engine::memory_share({.kind = engine::BackendKind::Cuda}, whole).weight_bytes);
}
#endif

}  // namespace
}  // namespace jambo::testing
