// Each op of the forward against the double-precision reference, for every weight dtype.
#include "backend/cpu/attention.h"
#include "backend/cpu/ffn.h"
#include "backend/cpu/mamba.h"
#include "backend/cpu/vector_ops.h"
#include "naive_reference.h"
#include "support/random_tensors.h"
#include "support/sequences.h"
#include "support/test_models.h"

#include <gtest/gtest.h>

#include <cmath>

namespace jambo::backend::cpu {
namespace {

using cpu::Matrix;

constexpr int64_t kNumTokens = 13;

naive::Rows to_rows(const Matrix& x) {
  naive::Rows rows;
  for (int64_t t = 0; t < x.num_rows(); ++t) rows.emplace_back(x.row(t), x.row(t) + x.num_cols());
  return rows;
}

void expect_close(const Matrix& actual, const naive::Rows& expected, double relative_tolerance) {
  ASSERT_EQ(size_t(actual.num_rows()), expected.size());
  double max_magnitude = 0.0;
  for (const auto& row : expected)
    for (double v : row) max_magnitude = std::max(max_magnitude, std::fabs(v));
  ASSERT_GT(max_magnitude, 0.0);
  for (int64_t t = 0; t < actual.num_rows(); ++t)
    for (int64_t i = 0; i < actual.num_cols(); ++i)
      ASSERT_NEAR(actual.row(t)[i], expected[t][i], relative_tolerance * max_magnitude) << "at (" << t << ", " << i << ")";
}

class OpsTest : public ::testing::TestWithParam<DType> {
 protected:
  // Layers 0 and 2 are Mamba with MoE, layers 1 and 3 attention with a dense MLP.
  model::Model model_ = make_random_model(testing::small_config(), GetParam(), 21);
  const model::JambaConfig& config_ = model_.config;
  testing::TensorStore store_{5};
  Matrix x_ = store_.matrix(kNumTokens, config_.hidden_size, 1.0f);  // [T, H]
};

TEST_P(OpsTest, RmsNorm) {
  Matrix out;
  const TensorView& weight = model_.weights.layers[0].input_norm;
  cpu::rms_norm_rows(x_, weight, float(config_.rms_norm_eps), out);
  expect_close(out, naive::rms_norm(to_rows(x_), weight, config_.rms_norm_eps), 1e-6);
}

TEST_P(OpsTest, MambaMixerFromZeroState) {
  const int64_t Di = config_.mamba_d_inner;
  std::vector<float> conv_tail(size_t(Di * (config_.mamba_d_conv - 1)));  // [Di, K-1]
  std::vector<float> ssm_state(size_t(Di * config_.mamba_d_state));       // [Di, N]
  const cpu::MambaRow row{0, kNumTokens, false, {conv_tail.data(), DType::F32}, {ssm_state.data(), DType::F32}, {}};
  Matrix out;
  cpu::mamba_mixer(model_.weights.layers[0].mamba, config_, x_, std::span(&row, 1), out);
  expect_close(out, naive::mamba(model_.weights.layers[0].mamba, config_, to_rows(x_)), 1e-5);
}

TEST_P(OpsTest, AttentionMixer) {
  cpu::KvCache kv_cache(config_, testing::test_cache(1));
  const testing::Sequence sequence(0, {});
  const cpu::AttentionRow row{0, kNumTokens, 0, sequence.block_table};
  Matrix out;
  cpu::attention_mixer(model_.weights.layers[1].attention, config_, kv_cache, 0, x_, std::span(&row, 1), out);
  expect_close(out, naive::attention(model_.weights.layers[1].attention, config_, to_rows(x_)), 1e-5);
}

TEST_P(OpsTest, DenseMlp) {
  Matrix out;
  cpu::dense_mlp(model_.weights.layers[1].mlp, x_, out);
  expect_close(out, naive::mlp(model_.weights.layers[1].mlp, to_rows(x_)), 1e-5);
}

TEST_P(OpsTest, SparseMoe) {
  Matrix out;
  cpu::sparse_moe(model_.weights.layers[0].moe, config_.num_experts_per_tok, x_, out);
  expect_close(out, naive::moe(model_.weights.layers[0].moe, config_.num_experts_per_tok, to_rows(x_)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(AllWeightDtypes, OpsTest, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace jambo::backend::cpu
