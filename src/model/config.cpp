// config.json -> JambaConfig (spec §1.1), layer kinds (spec §1.2) and validation.
#include "model/config.h"

#include "core/error.h"
#include "core/json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>

namespace jambo::model {
namespace {

void require_positive(const std::string& source, const char* field, int64_t value) {
  JAMBO_REQUIRE(value > 0, "{}: field '{}' = {} must be positive", source, field, value);
}

void require_at_most(const std::string& source, const char* field, int64_t value, int64_t max_value) {
  JAMBO_REQUIRE(value <= max_value, "{}: field '{}' = {} is larger than the supported maximum {}", source, field,
                value, max_value);
}

// Upper bounds far above any real model, so that no tensor size or offset product can overflow int64;
// token ids are int32.
void require_sane_sizes(const JambaConfig& c, const std::string& source) {
  constexpr int64_t kMaxWidth = int64_t(1) << 20;
  require_at_most(source, "vocab_size", c.vocab_size, INT32_MAX);
  require_at_most(source, "hidden_size", c.hidden_size, kMaxWidth);
  require_at_most(source, "intermediate_size", c.intermediate_size, kMaxWidth);
  require_at_most(source, "num_hidden_layers", c.num_hidden_layers, 4096);
  require_at_most(source, "num_attention_heads", c.num_attention_heads, 4096);
  require_at_most(source, "num_experts", c.num_experts, 4096);
  require_at_most(source, "mamba_d_state", c.mamba_d_state, 4096);
  require_at_most(source, "mamba_d_conv", c.mamba_d_conv, 64);
  require_at_most(source, "mamba_expand", c.mamba_expand, 64);
  require_at_most(source, "mamba_dt_rank", c.mamba_dt_rank, kMaxWidth);
}

void require_offset_below_period(const std::string& source, const char* offset_field,
                                 int64_t offset, const char* period_field, int64_t period) {
  JAMBO_REQUIRE(offset >= 0 && offset < period,
                "{}: field '{}' = {} must be at least 0 and less than '{}' ({})", source,
                offset_field, offset, period_field, period);
}

// Reads config.json fields with type checks; each error names the file and the field. A field that is absent
// or null keeps its default (spec §1.1): the fields whose null means something else (no such token, or
// num_key_value_heads = num_attention_heads) read it first.
class FieldReader {
 public:
  FieldReader(const nlohmann::json& object, std::string source)
      : object_(object), source_(std::move(source)) {}

  bool has(const char* field) const { return object_.contains(field); }
  bool is_null(const char* field) const { return has(field) && object_.at(field).is_null(); }

  void read(const char* field, int64_t& out) const {
    if (const nlohmann::json* value = given(field)) out = as_integer(field, *value);
  }

  void read(const char* field, bool& out) const {
    const nlohmann::json* value = given(field);
    if (!value) return;
    JAMBO_REQUIRE(value->is_boolean(), "{}: field '{}' must be true or false, got {}", source_,
                  field, describe_json(*value));
    out = value->get<bool>();
  }

  void read(const char* field, double& out) const {
    const nlohmann::json* value = given(field);
    if (!value) return;
    JAMBO_REQUIRE(value->is_number(), "{}: field '{}' must be a number, got {}", source_, field,
                  describe_json(*value));
    out = value->get<double>();
  }

  void read(const char* field, std::string& out) const {
    const nlohmann::json* value = given(field);
    if (!value) return;
    JAMBO_REQUIRE(value->is_string(), "{}: field '{}' must be a string, got {}", source_, field,
                  describe_json(*value));
    out = value->get<std::string>();
  }

  // A token id that may be null (no such token): null reads as -1.
  void read_optional_token(const char* field, int64_t& out) const {
    if (is_null(field)) {
      out = -1;
    } else {
      read(field, out);
    }
  }

  // eos_token_id: an integer, a list of integers, or null (no EOS).
  void read_token_list(const char* field, std::vector<int64_t>& out) const {
    if (!has(field)) return;
    const nlohmann::json& value = object_.at(field);
    out.clear();
    if (value.is_null()) return;
    if (!value.is_array()) {
      out.push_back(as_integer(field, value));
      return;
    }
    for (const nlohmann::json& item : value) out.push_back(as_integer(field, item));
  }

  // mamba_dt_rank: "auto" (kept as 0, resolved by finalize) or a positive integer.
  void read_dt_rank(const char* field, int64_t& out) const {
    const nlohmann::json* value = given(field);
    if (!value) return;
    if (value->is_string()) {
      JAMBO_REQUIRE(value->get<std::string>() == "auto",
                    "{}: field '{}' must be \"auto\" or a positive integer, got {}", source_,
                    field, describe_json(*value));
      out = 0;
      return;
    }
    out = as_integer(field, *value);
    require_positive(source_, field, out);
  }

 private:
  // The field's value, or nullptr when it is absent or null.
  const nlohmann::json* given(const char* field) const {
    const auto found = object_.find(field);
    return found == object_.end() || found->is_null() ? nullptr : &*found;
  }

  int64_t as_integer(const char* field, const nlohmann::json& value) const {
    JAMBO_REQUIRE(value.is_number_integer(), "{}: field '{}' must be an integer, got {}", source_,
                  field, describe_json(value));
    const std::optional<int64_t> integer = json_int64(value);
    JAMBO_REQUIRE(integer, "{}: field '{}' = {} is out of range", source_, field, value.dump());
    return *integer;
  }

  const nlohmann::json& object_;
  std::string source_;
};


// Every constraint that does not need the derived fields.
void require_valid_fields(const JambaConfig& c, const std::string& source) {
  JAMBO_REQUIRE(c.model_type == "jamba", "{}: field 'model_type' = \"{}\" is not supported (expected \"jamba\")",
                source, c.model_type);
  JAMBO_REQUIRE(c.hidden_act == "silu", "{}: field 'hidden_act' = \"{}\" is not supported (expected \"silu\")",
                source, c.hidden_act);
  require_positive(source, "vocab_size", c.vocab_size);
  require_positive(source, "hidden_size", c.hidden_size);
  require_positive(source, "intermediate_size", c.intermediate_size);
  require_positive(source, "num_hidden_layers", c.num_hidden_layers);
  require_positive(source, "num_attention_heads", c.num_attention_heads);
  require_positive(source, "num_key_value_heads", c.num_key_value_heads);
  require_positive(source, "num_experts", c.num_experts);
  require_positive(source, "expert_layer_period", c.expert_layer_period);
  require_positive(source, "attn_layer_period", c.attn_layer_period);
  require_positive(source, "mamba_d_state", c.mamba_d_state);
  require_positive(source, "mamba_d_conv", c.mamba_d_conv);
  require_positive(source, "mamba_expand", c.mamba_expand);
  require_positive(source, "max_position_embeddings", c.max_position_embeddings);
  require_sane_sizes(c, source);
  JAMBO_REQUIRE(c.mamba_dt_rank >= 0, "{}: field 'mamba_dt_rank' = {} must be positive or \"auto\"",
                source, c.mamba_dt_rank);
  JAMBO_REQUIRE(c.rms_norm_eps >= 0.0, "{}: field 'rms_norm_eps' = {} must not be negative", source,
                c.rms_norm_eps);
  require_offset_below_period(source, "expert_layer_offset", c.expert_layer_offset,
                              "expert_layer_period", c.expert_layer_period);
  require_offset_below_period(source, "attn_layer_offset", c.attn_layer_offset, "attn_layer_period",
                              c.attn_layer_period);
  JAMBO_REQUIRE(c.hidden_size % c.num_attention_heads == 0,
                "{}: field 'hidden_size' = {} is not divisible by 'num_attention_heads' = {}", source,
                c.hidden_size, c.num_attention_heads);
  JAMBO_REQUIRE(c.num_attention_heads % c.num_key_value_heads == 0,
                "{}: field 'num_attention_heads' = {} is not divisible by 'num_key_value_heads' = {}",
                source, c.num_attention_heads, c.num_key_value_heads);
}

}  // namespace

void JambaConfig::finalize(const std::string& source) {
  require_valid_fields(*this, source);
  head_dim = hidden_size / num_attention_heads;
  mamba_d_inner = mamba_expand * hidden_size;
  if (mamba_dt_rank == 0) mamba_dt_rank = (hidden_size + 15) / 16;  // "auto"
  mixer_kinds.assign(num_hidden_layers, MixerKind::Mamba);
  ffn_kinds.assign(num_hidden_layers, FfnKind::Dense);
  for (int64_t layer = 0; layer < num_hidden_layers; ++layer) {
    if (layer % attn_layer_period == attn_layer_offset) mixer_kinds[layer] = MixerKind::Attention;
    if (layer % expert_layer_period == expert_layer_offset && num_experts > 1)
      ffn_kinds[layer] = FfnKind::Moe;
  }
  // top-k matters only when some layer routes.
  const bool has_moe = std::count(ffn_kinds.begin(), ffn_kinds.end(), FfnKind::Moe) > 0;
  JAMBO_REQUIRE(!has_moe || (num_experts_per_tok >= 1 && num_experts_per_tok <= num_experts),
                "{}: field 'num_experts_per_tok' = {} must be between 1 and 'num_experts' = {}",
                source, num_experts_per_tok, num_experts);
}

int64_t JambaConfig::num_mamba_layers() const {
  return std::count(mixer_kinds.begin(), mixer_kinds.end(), MixerKind::Mamba);
}

int64_t JambaConfig::num_attention_layers() const {
  return std::count(mixer_kinds.begin(), mixer_kinds.end(), MixerKind::Attention);
}

int64_t JambaConfig::num_moe_layers() const { return std::count(ffn_kinds.begin(), ffn_kinds.end(), FfnKind::Moe); }

bool JambaConfig::is_eos(int64_t token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

JambaConfig load_config(const std::filesystem::path& config_json) {
  const std::string source = config_json.string();
  const nlohmann::json root = read_json_file(config_json);
  JAMBO_REQUIRE(root.is_object(), "{}: expected a JSON object at the top level", source);

  // Unknown fields are ignored, as transformers does.
  const FieldReader fields(root, source);
  JambaConfig config;
  fields.read("model_type", config.model_type);
  fields.read("vocab_size", config.vocab_size);
  fields.read("tie_word_embeddings", config.tie_word_embeddings);
  fields.read("hidden_size", config.hidden_size);
  fields.read("intermediate_size", config.intermediate_size);
  fields.read("num_hidden_layers", config.num_hidden_layers);
  fields.read("num_attention_heads", config.num_attention_heads);
  if (fields.is_null("num_key_value_heads")) {
    config.num_key_value_heads = config.num_attention_heads;
  } else {
    fields.read("num_key_value_heads", config.num_key_value_heads);
  }
  fields.read("hidden_act", config.hidden_act);
  fields.read("rms_norm_eps", config.rms_norm_eps);
  fields.read_optional_token("pad_token_id", config.pad_token_id);
  fields.read_optional_token("bos_token_id", config.bos_token_id);
  fields.read_token_list("eos_token_id", config.eos_token_ids);
  fields.read("num_experts_per_tok", config.num_experts_per_tok);
  fields.read("num_local_experts", config.num_experts);
  fields.read("num_experts", config.num_experts);
  fields.read("expert_layer_period", config.expert_layer_period);
  fields.read("expert_layer_offset", config.expert_layer_offset);
  fields.read("attn_layer_period", config.attn_layer_period);
  fields.read("attn_layer_offset", config.attn_layer_offset);
  fields.read("mamba_d_state", config.mamba_d_state);
  fields.read("mamba_d_conv", config.mamba_d_conv);
  fields.read("mamba_expand", config.mamba_expand);
  fields.read_dt_rank("mamba_dt_rank", config.mamba_dt_rank);
  fields.read("mamba_conv_bias", config.mamba_conv_bias);
  fields.read("mamba_proj_bias", config.mamba_proj_bias);
  fields.read("max_position_embeddings", config.max_position_embeddings);
  // transformers 5 writes "dtype", 4.x "torch_dtype"; given both, transformers keeps "dtype", and so does this.
  fields.read("torch_dtype", config.dtype);
  fields.read("dtype", config.dtype);
  config.finalize(source);
  return config;
}

}  // namespace jambo::model
