// The memory plan's seam: the bytes the CUDA backend holds for weights, counted without a GPU (so these run in
// CI too). f32 mode holds a 16-bit checkpoint at twice its size; bf16 mode holds 16-bit GEMM weights as stored
// and its small vectors and embedding table in fp32; an fp32 checkpoint takes its own size in either mode; f16
// mode holds every GEMM matrix in 2 bytes.
#include "support/test_models.h"
#include "engine/backend_factory.h"
#include "cuda_test_util.h"

namespace jambo::testing {
namespace {

TEST(CudaWeightBytes, F32ModeDoublesA16BitCheckpoint) {
  const model::Model model = make_random_model(small_config(), DType::BF16, 3);
  EXPECT_EQ(backend::cuda::cuda_weight_bytes(model, "f32"), 2 * model.weights.bytes_total);
  EXPECT_EQ(backend_weight_bytes(engine::BackendKind::Cuda, model, engine::CudaWeights::F32),
            2 * model.weights.bytes_total);
  EXPECT_EQ(backend_weight_bytes(engine::BackendKind::Cpu, model, engine::CudaWeights::F32), model.weights.bytes_total);
}

TEST(CudaWeightBytes, Bf16ModeKeepsMatricesAsStored) {
  const model::Model model = make_random_model(small_config(), DType::BF16, 3);
  const model::JambaConfig& c = model.config;
  // Everything but the GEMM matrices is fp32 in bf16 mode: 2 more bytes per element than stored, and the
  // embedding table (a row lookup in fp32) beside the lm_head matrix.
  int64_t small_elements = 0;
  auto add = [&](const TensorView& view) { small_elements += view.empty() ? 0 : view.numel(); };
  add(model.weights.final_norm);
  for (const model::LayerWeights& layer : model.weights.layers) {
    add(layer.input_norm);
    add(layer.pre_ff_norm);
    if (layer.mixer == model::MixerKind::Mamba) {
      const model::MambaWeights& m = layer.mamba;
      for (const TensorView* view : {&m.in_proj_bias, &m.conv_weight, &m.conv_bias, &m.dt_norm, &m.b_norm, &m.c_norm,
                                     &m.dt_proj_bias, &m.A_log, &m.D, &m.out_proj_bias})
        add(*view);
    }
  }
  const int64_t embedding = c.vocab_size * c.hidden_size;
  const int64_t expected =
      model.weights.bytes_total + 2 * small_elements + 2 * embedding + (c.tie_word_embeddings ? 2 * embedding : 0);
  EXPECT_EQ(backend::cuda::cuda_weight_bytes(model, "bf16"), expected);
}

TEST(CudaWeightBytes, Fp32CheckpointTakesItsOwnSize) {
  const model::Model model = make_random_model(small_config(), DType::F32, 3);
  EXPECT_EQ(backend::cuda::cuda_weight_bytes(model, "f32"), model.weights.bytes_total);
  EXPECT_EQ(backend::cuda::cuda_weight_bytes(model, "bf16"), model.weights.bytes_total);
}

// f16 mode: 16-bit GEMM matrices whatever the checkpoint's type, everything else as in the bf16 mode.
TEST(CudaWeightBytes, F16ModeHoldsMatricesInTwoBytes) {
  const model::Model bf16_model = make_random_model(small_config(), DType::BF16, 3);
  const model::Model f32_model = make_random_model(small_config(), DType::F32, 3);
  EXPECT_EQ(backend::cuda::cuda_weight_bytes(bf16_model, "f16"), backend::cuda::cuda_weight_bytes(bf16_model, "bf16"));
  EXPECT_EQ(backend::cuda::cuda_weight_bytes(f32_model, "f16"), backend::cuda::cuda_weight_bytes(bf16_model, "bf16"));
}

// The grouped expert GEMMs read a layer's experts alike: in the bf16 mode (matrices as stored) a checkpoint with
// one expert matrix of another type is refused, naming it; the f32 and f16 modes convert them all alike.
TEST(CudaWeightBytes, ExpertsOfMixedTypesAreRefusedInBf16Mode) {
  model::Model model = make_random_model(small_config(), DType::BF16, 3);
  int64_t moe_layer = 0;
  while (model.config.ffn_kinds[size_t(moe_layer)] != model::FfnKind::Moe) ++moe_layer;
  TensorView& odd = model.weights.layers[size_t(moe_layer)].moe.experts[1].down_proj;
  std::vector<float> wide(size_t(odd.numel()), 0.01f);
  odd.dtype = DType::F32;
  odd.data = wide.data();
  try {
    backend::cuda::cuda_weight_bytes(model, "bf16");
    FAIL() << "a layer whose experts differ in type was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(odd.name), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(backend::cuda::cuda_weight_bytes(model, "f32"));
  EXPECT_NO_THROW(backend::cuda::cuda_weight_bytes(model, "f16"));
}

// gate_proj and up_proj are held as one matrix: in the bf16 mode (as stored) they must share a type, and the
// refusal names both; the f32 mode converts both alike.
TEST(CudaWeightBytes, GateAndUpOfMixedTypesAreRefusedInBf16Mode) {
  model::Model model = make_random_model(small_config(), DType::BF16, 3);
  int64_t dense_layer = 0;
  while (model.config.ffn_kinds[size_t(dense_layer)] != model::FfnKind::Dense) ++dense_layer;
  model::MlpWeights& mlp = model.weights.layers[size_t(dense_layer)].mlp;
  std::vector<float> wide(size_t(mlp.up_proj.numel()), 0.01f);
  mlp.up_proj.dtype = DType::F32;
  mlp.up_proj.data = wide.data();
  try {
    backend::cuda::cuda_weight_bytes(model, "bf16");
    FAIL() << "gate_proj and up_proj of different types were accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(mlp.gate_proj.name), std::string::npos) << message;
    EXPECT_NE(message.find(mlp.up_proj.name), std::string::npos) << message;
  }
  EXPECT_NO_THROW(backend::cuda::cuda_weight_bytes(model, "f32"));
}

TEST(CudaWeightBytes, UnknownModeIsRefused) {
  const model::Model model = make_random_model(small_config(), DType::BF16, 3);
  EXPECT_THROW(backend::cuda::cuda_weight_bytes(model, "fp8"), Error);
}

}  // namespace
}  // namespace jambo::testing
