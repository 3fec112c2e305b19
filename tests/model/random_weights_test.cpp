// make_random_model: shapes, scales, determinism across thread counts, dtype conversions. describe_random_model:
// the same names, shapes, dtypes and byte counts without host data, and a recipe that gives the host fill's bytes.
#include "checkpoint_builder.h"
#include "core/error.h"
#include "model/random_weights.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace jambo::model {
namespace {

using model_test::all_tensors;
using model_test::values_of;

// A small config with every tensor kind: attention at layer 1, MoE at odd layers, biases on.
JambaConfig small_config() {
  JambaConfig config;
  config.vocab_size = 300;
  config.hidden_size = 64;
  config.intermediate_size = 96;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.num_experts = 4;
  config.num_experts_per_tok = 2;
  config.attn_layer_period = 2;
  config.attn_layer_offset = 1;
  config.mamba_proj_bias = true;
  return config;
}

JambaConfig with_tied_head(JambaConfig config, bool tied) {
  config.tie_word_embeddings = tied;
  return config;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.numel() == b.numel() && a.dtype == b.dtype &&
         std::memcmp(a.data, b.data, a.numel() * dtype_size(a.dtype)) == 0;
}

bool same_model_bytes(const Model& a, const Model& b) {
  const auto left = all_tensors(a.weights), right = all_tensors(b.weights);
  for (size_t i = 0; i < left.size(); ++i) {
    if (left[i]->empty() != right[i]->empty()) return false;
    if (!left[i]->empty() && !same_bytes(*left[i], *right[i])) return false;
  }
  return true;
}

// Parameter count of small_config() written out by hand from spec §2.1.
int64_t expected_parameter_count(const JambaConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, E = c.num_experts;
  const int64_t Di = 2 * H, N = 16, K = 4, R = (H + 15) / 16, hd = H / c.num_attention_heads;
  const int64_t mamba = 2 * Di * H + 2 * Di + Di * K + Di + (R + 2 * N) * Di + R + 2 * N + Di * R +
                        Di + Di * N + Di + H * Di + H;
  const int64_t attention = 2 * H * H + 2 * (c.num_key_value_heads * hd) * H;
  const int64_t dense = 3 * I * H, moe = E * H + E * 3 * I * H;
  // layers: 0 mamba+dense, 1 attention+moe, 2 mamba+dense, 3 attention+moe; norms 2H per layer
  return 2 * V * H + H + 4 * 2 * H + 2 * mamba + 2 * attention + 2 * dense + 2 * moe;
}

TEST(RandomWeights, ShapesAndByteCountFollowTheSpec) {
  const Model model = make_random_model(small_config(), DType::BF16, 7);
  const JambaConfig& c = model.config;
  EXPECT_EQ(model.weights.bytes_total, 2 * expected_parameter_count(c));
  ASSERT_EQ(model.weights.layers.size(), 4u);
  const LayerWeights& mamba = model.weights.layers[0];
  EXPECT_EQ(mamba.mixer, MixerKind::Mamba);
  EXPECT_EQ(mamba.ffn, FfnKind::Dense);
  EXPECT_EQ(mamba.mamba.conv_weight.shape, (std::vector<int64_t>{128, 1, 4}));
  EXPECT_EQ(mamba.mamba.x_proj.shape, (std::vector<int64_t>{4 + 32, 128}));
  EXPECT_EQ(mamba.mamba.in_proj_bias.shape, (std::vector<int64_t>{256}));
  const LayerWeights& attention = model.weights.layers[1];
  EXPECT_EQ(attention.mixer, MixerKind::Attention);
  EXPECT_EQ(attention.ffn, FfnKind::Moe);
  EXPECT_EQ(attention.attention.k_proj.shape, (std::vector<int64_t>{32, 64}));
  ASSERT_EQ(attention.moe.experts.size(), 4u);
  EXPECT_EQ(attention.moe.experts[3].down_proj.shape, (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(model.weights.lm_head.name, "lm_head.weight");
  EXPECT_NE(model.weights.lm_head.data, model.weights.embed_tokens.data);
}

TEST(RandomWeights, OptionalTensorsFollowTheConfigSwitches) {
  JambaConfig config = small_config();
  config.mamba_proj_bias = false;
  config.mamba_conv_bias = false;
  config.tie_word_embeddings = true;
  const Model model = make_random_model(config, DType::F32, 7);
  const MambaWeights& mamba = model.weights.layers[0].mamba;
  EXPECT_TRUE(mamba.in_proj_bias.empty());
  EXPECT_TRUE(mamba.out_proj_bias.empty());
  EXPECT_TRUE(mamba.conv_bias.empty());
  EXPECT_EQ(model.weights.lm_head.data, model.weights.embed_tokens.data);
  // A tied head gets a final norm of random signs (see random_weights.cpp).
  const std::vector<float> final_norm = values_of(model.weights.final_norm);
  for (float v : final_norm) EXPECT_EQ(std::fabs(v), 1.0f);
  EXPECT_GT(std::count(final_norm.begin(), final_norm.end(), -1.0f), 16);
  EXPECT_GT(std::count(final_norm.begin(), final_norm.end(), 1.0f), 16);
  const int64_t without_biases = expected_parameter_count(config) - 2 * (2 * 128 + 128 + 64);
  EXPECT_EQ(model.weights.bytes_total, 4 * (without_biases - config.vocab_size * 64));
}

TEST(RandomWeights, ScalesLikeATrainedModel) {
  const Model model = make_random_model(small_config(), DType::F32, 11);
  const MambaWeights& mamba = model.weights.layers[0].mamba;
  // Linear weights: standard deviation 1/sqrt(fan_in).
  const std::vector<float> in_proj = values_of(mamba.in_proj);
  double sum_squares = 0;
  for (float v : in_proj) sum_squares += double(v) * v;
  EXPECT_NEAR(std::sqrt(sum_squares / in_proj.size()), 1.0 / 8.0, 0.005);
  // A_log = log(1..N) on every row.
  for (int64_t row : {0, 127})
    for (int64_t n = 0; n < 16; ++n) EXPECT_FLOAT_EQ(mamba.A_log.at(row * 16 + n), std::log(n + 1.0f));
  // softplus(dt bias) in [1e-3, 1e-1]; norms and D near 1.
  for (float bias : values_of(mamba.dt_proj_bias)) {
    const double dt = std::log1p(std::exp(double(bias)));
    EXPECT_GE(dt, 0.999e-3);
    EXPECT_LE(dt, 1.001e-1);
  }
  for (float v : values_of(mamba.D)) EXPECT_NEAR(v, 1.0f, 0.1f);
  for (float v : values_of(model.weights.final_norm)) EXPECT_NEAR(v, 1.0f, 0.1f);
}

TEST(RandomWeights, SameSeedSameBytesForAnyThreadCount) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Model one_thread = make_random_model(small_config(), DType::BF16, 42);
  omp_set_num_threads(2);
  const Model two_threads = make_random_model(small_config(), DType::BF16, 42);
  const Model other_seed = make_random_model(small_config(), DType::BF16, 43);
  omp_set_num_threads(saved_threads);
  EXPECT_TRUE(same_model_bytes(one_thread, two_threads));
  EXPECT_FALSE(same_bytes(one_thread.weights.embed_tokens, other_seed.weights.embed_tokens));
}

TEST(RandomWeights, HalfPrecisionModelsRoundTheF32Values) {
  const Model f32 = make_random_model(small_config(), DType::F32, 5);
  const Model b16 = make_random_model(small_config(), DType::BF16, 5);
  const Model f16 = make_random_model(small_config(), DType::F16, 5);
  const TensorView& exact = f32.weights.layers[2].mamba.x_proj;
  const TensorView& bf = b16.weights.layers[2].mamba.x_proj;
  const TensorView& half = f16.weights.layers[2].mamba.x_proj;
  for (int64_t i = 0; i < exact.numel(); ++i) {
    EXPECT_EQ(bf.at(i), to_float(to_bf16(exact.at(i))));
    // round to nearest: within half an ulp (2^-11 relative, or 2^-25 absolute for subnormals)
    EXPECT_LE(std::fabs(half.at(i) - exact.at(i)),
              std::max(std::fabs(exact.at(i)) * 0x1p-11f, 0x1p-25f));
  }
}

class DescribedModelTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(DescribedModelTest, RecipeGivesTheHostFillsBytes) {
  const auto [dtype, tied] = GetParam();
  const Model made = make_random_model(with_tied_head(small_config(), tied), dtype, 42);
  const Model described = describe_random_model(with_tied_head(small_config(), tied), dtype, 42);
  ASSERT_TRUE(made.has_host_data());
  ASSERT_FALSE(described.has_host_data());
  EXPECT_EQ(described.weights.bytes_total, made.weights.bytes_total);
  EXPECT_EQ(described.weights.lm_head.data == described.weights.embed_tokens.data, tied);
  const auto expected = all_tensors(made.weights), actual = all_tensors(described.weights);
  ASSERT_EQ(expected.size(), actual.size());
  std::set<const void*> addresses;
  int64_t num_compared = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorView &host = *expected[i], &view = *actual[i];
    ASSERT_EQ(host.empty(), view.empty()) << host.name;
    if (host.empty()) continue;
    EXPECT_EQ(view.name, host.name);
    EXPECT_EQ(view.shape, host.shape) << host.name;
    EXPECT_EQ(view.dtype, host.dtype) << host.name;
    // Distinct addresses for distinct tensors: what de-duplicating uploads by address relies on.
    if (!(tied && &view == &described.weights.lm_head)) {
      EXPECT_TRUE(addresses.insert(view.data).second) << host.name;
    }
    const RandomTensor& tensor = described.random_recipe->tensor(view);
    std::vector<std::byte> bytes(size_t(host.numel() * dtype_size(host.dtype)));
    RandomWeights::fill_host(tensor, bytes.data(), 0, tensor.numel);
    EXPECT_EQ(std::memcmp(bytes.data(), host.data, bytes.size()), 0) << host.name;
    ++num_compared;
  }
  EXPECT_GT(num_compared, 40);
}

INSTANTIATE_TEST_SUITE_P(DTypesAndHeads, DescribedModelTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16), ::testing::Bool()));

TEST(DescribedModel, RecipeRefusesAViewItDoesNotHold) {
  const Model described = describe_random_model(small_config(), DType::BF16, 1);
  TensorView stranger = described.weights.final_norm;
  stranger.name = "model.layers.9.mamba.D";
  try {
    described.random_recipe->tensor(stranger);
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("'model.layers.9.mamba.D'"), std::string::npos) << error.what();
  }
  TensorView resized = described.weights.final_norm;
  resized.shape = {3};
  EXPECT_THROW(described.random_recipe->tensor(resized), Error);
}

TEST(DescribedModel, HostReadersAreRefusedByName) {
  const Model described = describe_random_model(small_config(), DType::BF16, 1);
  try {
    require_host_data(described, "the CPU backend");
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the CPU backend reads the weights from host memory"), std::string::npos) << message;
    EXPECT_NE(message.find("--backend cuda"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(require_host_data(make_random_model(small_config(), DType::BF16, 1), "the CPU backend"));
}

}  // namespace
}  // namespace jambo::model
