// Small random Jamba models that together cover the config switches the forward depends on.
#pragma once

#include "model/weights.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace jambo::testing {

struct TestModelSpec {
  std::string name;
  model::JambaConfig config;
  DType dtype;
};

inline model::JambaConfig small_config() {
  model::JambaConfig config;
  config.vocab_size = 64;
  config.hidden_size = 32;
  config.intermediate_size = 48;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.num_experts = 4;
  config.num_experts_per_tok = 2;
  config.expert_layer_period = 2;
  config.expert_layer_offset = 0;
  config.attn_layer_period = 2;
  config.attn_layer_offset = 1;
  config.mamba_d_state = 8;
  config.mamba_d_conv = 4;
  config.mamba_expand = 2;
  config.rms_norm_eps = 1e-6;
  return config;
}

inline std::vector<TestModelSpec> test_model_specs() {
  std::vector<TestModelSpec> specs;

  model::JambaConfig moe_gqa4 = small_config();  // MoE top-2, 4 query heads per KV head, d_conv 4
  moe_gqa4.num_attention_heads = 8;
  specs.push_back({"moe_gqa4_conv4_f32", moe_gqa4, DType::F32});

  // dense, MQA, d_conv 2, projection biases, no conv bias, an intermediate size that is no multiple of 4 (no vector
  // loads along it on the GPU)
  model::JambaConfig dense_mqa = small_config();
  dense_mqa.num_key_value_heads = 1;
  dense_mqa.intermediate_size = 50;
  dense_mqa.num_experts = 1;
  dense_mqa.mamba_d_conv = 2;
  dense_mqa.mamba_proj_bias = true;
  dense_mqa.mamba_conv_bias = false;
  dense_mqa.mamba_dt_rank = 5;
  dense_mqa.attn_layer_period = 3;
  dense_mqa.attn_layer_offset = 2;
  specs.push_back({"dense_mqa_conv2_bf16", dense_mqa, DType::BF16});

  model::JambaConfig moe_top1 = small_config();  // MoE top-1 on every layer, plain multi-head, d_conv 3
  moe_top1.num_hidden_layers = 3;
  moe_top1.num_key_value_heads = 4;
  moe_top1.num_experts = 3;
  moe_top1.num_experts_per_tok = 1;
  moe_top1.expert_layer_period = 1;
  moe_top1.mamba_d_conv = 3;
  moe_top1.mamba_d_state = 4;
  moe_top1.mamba_expand = 1;
  moe_top1.attn_layer_period = 4;
  moe_top1.attn_layer_offset = 0;
  specs.push_back({"moe_top1_mha_conv3_f16", moe_top1, DType::F16});

  model::JambaConfig tied = small_config();  // 2 query heads per KV head, tied embeddings, both biases
  tied.tie_word_embeddings = true;
  tied.mamba_proj_bias = true;
  tied.num_experts = 1;
  specs.push_back({"dense_gqa2_tied_bf16", tied, DType::BF16});

  model::JambaConfig wide = small_config();  // wide enough that the GEMMs run on several threads
  wide.hidden_size = 128;
  wide.intermediate_size = 192;
  wide.vocab_size = 512;
  wide.num_attention_heads = 8;
  wide.mamba_d_state = 16;
  specs.push_back({"wide_moe_gqa4_bf16", wide, DType::BF16});
  return specs;
}

inline void PrintTo(const TestModelSpec& spec, std::ostream* out) { *out << spec.name; }

inline std::string spec_name(const ::testing::TestParamInfo<TestModelSpec>& info) { return info.param.name; }

}  // namespace jambo::testing
