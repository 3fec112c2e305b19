// JambaConfig: every field of transformers' JambaConfig with its default (spec §1.1), the derived
// layer kinds (spec §1.2) and validation. Parsed from a checkpoint's config.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace jambo::model {

enum class MixerKind { Mamba, Attention };
enum class FfnKind { Dense, Moe };

struct JambaConfig {
  std::string model_type = "jamba";
  int64_t vocab_size = 65536;
  bool tie_word_embeddings = false;
  int64_t hidden_size = 4096;             // H
  int64_t intermediate_size = 14336;      // I (dense MLP and every expert)
  int64_t num_hidden_layers = 32;         // L
  int64_t num_attention_heads = 32;       // nh
  int64_t num_key_value_heads = 8;        // nkv; null in config.json means nh
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  int64_t pad_token_id = 0;
  int64_t bos_token_id = 1;
  std::vector<int64_t> eos_token_ids = {2};  // eos_token_id: an int or a list
  int64_t num_experts_per_tok = 2;         // k
  int64_t num_experts = 16;                // E (alias num_local_experts)
  int64_t expert_layer_period = 2;
  int64_t expert_layer_offset = 1;
  int64_t attn_layer_period = 8;
  int64_t attn_layer_offset = 4;
  int64_t mamba_d_state = 16;              // N
  int64_t mamba_d_conv = 4;                // K
  int64_t mamba_expand = 2;
  int64_t mamba_dt_rank = 0;               // R; "auto" resolves to ceil(H / 16)
  bool mamba_conv_bias = true;
  bool mamba_proj_bias = false;
  int64_t max_position_embeddings = 262144;  // no effect on the math; bounds the engine's max_model_len
  std::string dtype = "bfloat16";           // "dtype" or "torch_dtype"; informational: tensors carry their own

  // Derived, filled by finalize().
  int64_t head_dim = 0;                    // hd = H / nh
  int64_t mamba_d_inner = 0;               // Di = expand * H
  std::vector<MixerKind> mixer_kinds;      // [L]
  std::vector<FfnKind> ffn_kinds;          // [L]

  // Derives the fields above and checks every constraint; throws jambo::Error naming the field.
  void finalize(const std::string& source);

  int64_t num_mamba_layers() const;
  int64_t num_attention_layers() const;
  int64_t num_moe_layers() const;
  bool is_eos(int64_t token) const;

  friend bool operator==(const JambaConfig&, const JambaConfig&) = default;
};

// Parses config.json (a file path); errors name the file and the field.
JambaConfig load_config(const std::filesystem::path& config_json);

}  // namespace jambo::model
