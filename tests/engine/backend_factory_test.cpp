// Parsing the backend flags' values (every spelling, and a bad one refused by name with the valid ones listed), and
// make_backend's guard: the CPU backend reads weights from host memory, so a model whose random weights are only
// described (for the GPU to generate) is refused with a message saying so, before any read.
#include "engine/backend_factory.h"
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
  EXPECT_EQ(parse_backend_kind("cpu"), BackendKind::Cpu);
#ifdef JAMBO_WITH_CUDA
  EXPECT_EQ(parse_backend_kind("cuda"), BackendKind::Cuda);
  EXPECT_EQ(backend_names(), (std::vector<std::string_view>{"cpu", "cuda"}));
#else
  EXPECT_EQ(backend_names(), (std::vector<std::string_view>{"cpu"}));
  expect_refused(parse_backend_kind, "cuda", {"not in this build", "cpu", "nvcc"});
#endif
  expect_refused(parse_backend_kind, "tpu", backend_names());
  expect_refused(parse_backend_kind, "CPU", backend_names());
}

TEST(BackendFactory, ParsesEveryWeightModeAndStateDtype) {
  EXPECT_EQ(parse_cuda_weights("f32"), CudaWeights::F32);
  EXPECT_EQ(parse_cuda_weights("bf16"), CudaWeights::Bf16);
  EXPECT_EQ(parse_cuda_weights("f16"), CudaWeights::F16);
  EXPECT_EQ(cuda_weights_names(), (std::vector<std::string_view>{"f32", "bf16", "f16"}));
  expect_refused(parse_cuda_weights, "fp8", cuda_weights_names());

  EXPECT_EQ(parse_state_dtype("f32"), DType::F32);
  EXPECT_EQ(parse_state_dtype("bf16"), DType::BF16);
  EXPECT_EQ(state_dtype_names(), (std::vector<std::string_view>{"f32", "bf16"}));
  expect_refused(parse_state_dtype, "f16", state_dtype_names());
}

// name() spells each value as its flag takes it.
TEST(BackendFactory, NamesParseBack) {
  for (const BackendKind kind : available_backends()) EXPECT_EQ(parse_backend_kind(std::string(name(kind))), kind);
  for (const CudaWeights weights : {CudaWeights::F32, CudaWeights::Bf16, CudaWeights::F16})
    EXPECT_EQ(parse_cuda_weights(std::string(name(weights))), weights);
  for (const DType dtype : {DType::F32, DType::BF16})
    EXPECT_EQ(parse_state_dtype(std::string(state_dtype_name(dtype))), dtype);
}

TEST(BackendFactory, CpuBackendRefusesAModelWithoutHostData) {
  const Model described = describe_random_model(small_config(), DType::BF16, 5);
  try {
    make_backend(BackendKind::Cpu, described, test_cache(1));
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the CPU backend reads the weights from host memory"), std::string::npos)
        << error.what();
  }
  // Counting the bytes a backend holds reads no weights: it works on a described model.
  EXPECT_EQ(backend_weight_bytes(BackendKind::Cpu, described),
            make_random_model(small_config(), DType::BF16, 5).weights.bytes_total);
}

}  // namespace
}  // namespace jambo::testing
