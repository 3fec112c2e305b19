// load_config: defaults, aliases, layer kinds and every validation error (spec §1).
#include "checkpoint_builder.h"
#include "core/error.h"
#include "model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace jambo::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using model_test::TempFolder;
using nlohmann::json;

JambaConfig load_json(const TempFolder& folder, const json& config) {
  model_test::write_text(folder / "config.json", config.dump());
  return load_config(folder / "config.json");
}

// The message of the jambo::Error that loading `text` as config.json throws.
std::string load_error(const TempFolder& folder, const std::string& text) {
  model_test::write_text(folder / "config.json", text);
  try {
    load_config(folder / "config.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(Config, JambaV01ConfigGivesItsLayerKinds) {
  TempFolder folder;
  // ai21labs/Jamba-v0.1 config.json, with its remote-code leftovers that must be ignored.
  const json v01 = {{"architectures", {"JambaForCausalLM"}}, {"attn_layer_offset", 4},
                    {"attn_layer_period", 8}, {"auto_map", {{"AutoConfig", "configuration_jamba.JambaConfig"}}},
                    {"bos_token_id", 1}, {"calc_logits_for_entire_prompt", false}, {"eos_token_id", 2},
                    {"expert_layer_offset", 1}, {"expert_layer_period", 2}, {"hidden_act", "silu"},
                    {"hidden_size", 4096}, {"initializer_range", 0.02}, {"intermediate_size", 14336},
                    {"mamba_conv_bias", true}, {"mamba_d_conv", 4}, {"mamba_d_state", 16},
                    {"mamba_dt_rank", 256}, {"mamba_expand", 2}, {"mamba_inner_layernorms", true},
                    {"mamba_proj_bias", false}, {"max_position_embeddings", 262144},
                    {"model_type", "jamba"}, {"n_ctx", 262144}, {"num_attention_heads", 32},
                    {"num_experts", 16}, {"num_experts_per_tok", 2}, {"num_hidden_layers", 32},
                    {"num_key_value_heads", 8}, {"pad_token_id", 0}, {"rms_norm_eps", 1e-06},
                    {"sliding_window", nullptr}, {"tie_word_embeddings", false},
                    {"torch_dtype", "bfloat16"}, {"use_cache", true}, {"use_mamba_kernels", true},
                    {"vocab_size", 65536}};
  const JambaConfig config = load_json(folder, v01);
  for (int64_t layer = 0; layer < 32; ++layer) {
    const bool attention = layer == 4 || layer == 12 || layer == 20 || layer == 28;
    EXPECT_EQ(config.mixer_kinds[layer], attention ? MixerKind::Attention : MixerKind::Mamba) << layer;
    EXPECT_EQ(config.ffn_kinds[layer], layer % 2 == 1 ? FfnKind::Moe : FfnKind::Dense) << layer;
  }
  EXPECT_EQ(config.num_attention_layers(), 4);
  EXPECT_EQ(config.num_mamba_layers(), 28);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.mamba_d_inner, 8192);
  EXPECT_TRUE(config.is_eos(2));
  EXPECT_FALSE(config.is_eos(1));
}

TEST(Config, AbsentFieldsTakeTransformersDefaults) {
  TempFolder folder;
  const JambaConfig config = load_json(folder, json::object());
  EXPECT_EQ(config.vocab_size, 65536);
  EXPECT_EQ(config.hidden_size, 4096);
  EXPECT_EQ(config.intermediate_size, 14336);
  EXPECT_EQ(config.num_hidden_layers, 32);
  EXPECT_EQ(config.num_key_value_heads, 8);
  EXPECT_EQ(config.num_experts, 16);
  EXPECT_EQ(config.mamba_dt_rank, 256);  // "auto"
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-6);
  EXPECT_TRUE(config.mamba_conv_bias);
  EXPECT_FALSE(config.mamba_proj_bias);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_EQ(config.mixer_kinds[4], MixerKind::Attention);
}

TEST(Config, AutoDtRankNullKvHeadsEosListAndExpertAlias) {
  TempFolder folder;
  const JambaConfig config = load_json(folder, {{"hidden_size", 100}, {"num_attention_heads", 4},
                                                {"num_key_value_heads", nullptr},
                                                {"mamba_dt_rank", "auto"}, {"eos_token_id", {2, 518}},
                                                {"num_local_experts", 4}, {"pad_token_id", nullptr}});
  EXPECT_EQ(config.mamba_dt_rank, 7);  // ceil(100 / 16)
  EXPECT_EQ(config.num_key_value_heads, 4);
  EXPECT_TRUE(config.is_eos(518));
  EXPECT_TRUE(config.is_eos(2));
  EXPECT_EQ(config.num_experts, 4);
  EXPECT_EQ(config.pad_token_id, -1);
  EXPECT_EQ(load_json(folder, {{"mamba_dt_rank", 12}}).mamba_dt_rank, 12);
}

// transformers accepts null for a field; null means "use the default" (spec §1.1), as if the field were absent.
TEST(Config, NullTakesTheDefault) {
  TempFolder folder;
  const JambaConfig defaults = load_json(folder, json::object());
  for (const char* field :
       {"model_type", "vocab_size", "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "hidden_act", "rms_norm_eps", "num_experts_per_tok", "num_local_experts",
        "num_experts", "expert_layer_period", "expert_layer_offset", "attn_layer_period", "attn_layer_offset",
        "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank", "mamba_conv_bias", "mamba_proj_bias",
        "max_position_embeddings", "dtype", "torch_dtype"}) {
    SCOPED_TRACE(field);
    EXPECT_TRUE(load_json(folder, {{field, nullptr}}) == defaults);
  }
  // Where null means something of its own: no such token, no EOS, as many KV heads as heads.
  EXPECT_EQ(load_json(folder, {{"bos_token_id", nullptr}}).bos_token_id, -1);
  EXPECT_TRUE(load_json(folder, {{"eos_token_id", nullptr}}).eos_token_ids.empty());
  EXPECT_EQ(load_json(folder, {{"num_key_value_heads", nullptr}}).num_key_value_heads, 32);
}

// transformers 5 writes "dtype", 4.x "torch_dtype"; given both, transformers keeps "dtype", or "torch_dtype" when
// "dtype" is null.
TEST(Config, DtypeUnderEitherNameDtypeFirst) {
  TempFolder folder;
  EXPECT_EQ(load_json(folder, json::object()).dtype, "bfloat16");
  EXPECT_EQ(load_json(folder, {{"dtype", "float32"}}).dtype, "float32");
  EXPECT_EQ(load_json(folder, {{"torch_dtype", "float16"}}).dtype, "float16");
  EXPECT_EQ(load_json(folder, {{"dtype", "float32"}, {"torch_dtype", "bfloat16"}}).dtype, "float32");
  EXPECT_EQ(load_json(folder, {{"dtype", nullptr}, {"torch_dtype", "float16"}}).dtype, "float16");
  EXPECT_EQ(load_json(folder, {{"dtype", nullptr}, {"torch_dtype", nullptr}}).dtype, "bfloat16");
}

TEST(Config, SingleExpertMeansDenseEverywhere) {
  TempFolder folder;
  const JambaConfig config = load_json(folder, {{"num_experts", 1}, {"num_experts_per_tok", 5}});
  for (FfnKind kind : config.ffn_kinds) EXPECT_EQ(kind, FfnKind::Dense);
}

TEST(Config, EachBadValueIsNamed) {
  TempFolder folder;
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"attn_layer_offset", 8}}, "'attn_layer_offset' = 8"},
      {{{"expert_layer_offset", 2}}, "'expert_layer_offset' = 2"},
      {{{"expert_layer_offset", -1}}, "'expert_layer_offset' = -1"},
      {{{"num_attention_heads", 5}}, "'num_attention_heads' = 5"},
      {{{"num_key_value_heads", 3}}, "'num_key_value_heads' = 3"},
      {{{"num_experts_per_tok", 17}}, "'num_experts_per_tok' = 17"},
      {{{"num_experts_per_tok", 0}}, "'num_experts_per_tok' = 0"},
      {{{"hidden_size", 0}}, "'hidden_size' = 0"},
      {{{"vocab_size", -5}}, "'vocab_size' = -5"},
      {{{"mamba_d_conv", 0}}, "'mamba_d_conv' = 0"},
      {{{"attn_layer_period", 0}}, "'attn_layer_period' = 0"},
      {{{"hidden_act", "gelu"}}, "'hidden_act' = \"gelu\""},
      {{{"model_type", "llama"}}, "'model_type' = \"llama\""},
      {{{"mamba_dt_rank", "big"}}, "'mamba_dt_rank'"},
      {{{"mamba_dt_rank", 0}}, "'mamba_dt_rank' = 0"},
      {{{"rms_norm_eps", -1.0}}, "'rms_norm_eps'"},
      {{{"vocab_size", "many"}}, "'vocab_size' must be an integer"},
      {{{"hidden_size", 4096.5}}, "'hidden_size' must be an integer"},
      {{{"tie_word_embeddings", "yes"}}, "'tie_word_embeddings' must be true or false"},
      {{{"rms_norm_eps", "small"}}, "'rms_norm_eps' must be a number"},
      {{{"eos_token_id", "two"}}, "'eos_token_id' must be an integer"},
      {{{"model_type", 7}}, "'model_type' must be a string"},
      {{{"hidden_size", UINT64_MAX}}, "'hidden_size' = 18446744073709551615 is out of range"},
      {{{"eos_token_id", {2, UINT64_MAX}}}, "'eos_token_id' = 18446744073709551615 is out of range"},
      {{{"max_position_embeddings", -4}}, "'max_position_embeddings' = -4 must be positive"},
      {{{"max_position_embeddings", 0}}, "'max_position_embeddings' = 0 must be positive"},
  };
  for (const auto& [config, expected] : cases) {
    SCOPED_TRACE(config.dump());
    EXPECT_THAT(load_error(folder, config.dump()), AllOf(HasSubstr("config.json"), HasSubstr(expected)));
  }
}

TEST(Config, MalformedJsonNamesFileAndPosition) {
  TempFolder folder;
  EXPECT_THAT(load_error(folder, "{\"hidden_size\": 64,\n  \"vocab_size\": }"),
              AllOf(HasSubstr("config.json"), HasSubstr("malformed JSON"), HasSubstr("line 2")));
  EXPECT_THAT(load_error(folder, "[1, 2]"), AllOf(HasSubstr("config.json"), HasSubstr("object")));
}

TEST(Config, MissingFileIsNamed) {
  TempFolder folder;
  try {
    load_config(folder / "config.json");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr((folder / "config.json").string()));
  }
}

}  // namespace
}  // namespace jambo::model
