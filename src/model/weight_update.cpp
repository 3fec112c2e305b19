// read_weight_update: a checkpoint folder's tensors matched to the model's weights, every one checked first.
#include "model/weight_update.h"

#include "core/error.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weight_layout.h"

#include <fmt/format.h>

#include <optional>
#include <set>

namespace jambo::model {
namespace {

namespace fs = std::filesystem;

// The config.json fields that decide the weights' names and shapes and the forward's arithmetic; a trainer's save
// may change the others (dtype, token ids, max_position_embeddings).
void require_same_architecture(const fs::path& config_path, const JambaConfig& model) {
  const JambaConfig folder = load_config(config_path);
  const auto differs = [&](const char* field, const auto& ours, const auto& theirs) {
    JAMBO_REQUIRE(ours == theirs, "{}: '{}' is {}, the serving model's is {}: a weight update must be of the same "
                  "architecture", config_path.string(), field, theirs, ours);
  };
  differs("vocab_size", model.vocab_size, folder.vocab_size);
  differs("tie_word_embeddings", model.tie_word_embeddings, folder.tie_word_embeddings);
  differs("hidden_size", model.hidden_size, folder.hidden_size);
  differs("intermediate_size", model.intermediate_size, folder.intermediate_size);
  differs("num_hidden_layers", model.num_hidden_layers, folder.num_hidden_layers);
  differs("num_attention_heads", model.num_attention_heads, folder.num_attention_heads);
  differs("num_key_value_heads", model.num_key_value_heads, folder.num_key_value_heads);
  differs("hidden_act", model.hidden_act, folder.hidden_act);
  differs("rms_norm_eps", model.rms_norm_eps, folder.rms_norm_eps);
  differs("num_experts", model.num_experts, folder.num_experts);
  differs("num_experts_per_tok", model.num_experts_per_tok, folder.num_experts_per_tok);
  differs("expert_layer_period", model.expert_layer_period, folder.expert_layer_period);
  differs("expert_layer_offset", model.expert_layer_offset, folder.expert_layer_offset);
  differs("attn_layer_period", model.attn_layer_period, folder.attn_layer_period);
  differs("attn_layer_offset", model.attn_layer_offset, folder.attn_layer_offset);
  differs("mamba_d_state", model.mamba_d_state, folder.mamba_d_state);
  differs("mamba_d_conv", model.mamba_d_conv, folder.mamba_d_conv);
  differs("mamba_expand", model.mamba_expand, folder.mamba_expand);
  differs("mamba_dt_rank", model.mamba_dt_rank, folder.mamba_dt_rank);
  differs("mamba_conv_bias", model.mamba_conv_bias, folder.mamba_conv_bias);
  differs("mamba_proj_bias", model.mamba_proj_bias, folder.mamba_proj_bias);
}

// The slot's new values from the folder and the tensor they come from: its per-expert tensor, or its rows of the
// fused expert tensor; none when the folder holds neither. A folder holding both for one weight is refused: which one
// it meant is unknowable.
struct Source {
  std::string tensor;
  TensorView values;
};
std::optional<Source> source_of(const Checkpoint& checkpoint, const WeightSlot& slot) {
  const bool per_expert = checkpoint.find(slot.name) != nullptr;
  const bool fused = slot.fused && checkpoint.find(slot.fused->name) != nullptr;
  JAMBO_REQUIRE(!(per_expert && fused), "{}: holds both '{}' and '{}', which give the same weight",
                checkpoint.source(), slot.name, slot.fused->name);
  if (per_expert) return Source{slot.name, checkpoint.get(slot.name, slot.shape)};
  if (!fused) return std::nullopt;
  return Source{slot.fused->name, slot.fused->rows_of(checkpoint.get(slot.fused->name, slot.fused->shape))};
}

}  // namespace

WeightUpdate read_weight_update(const fs::path& folder, const Model& model) {
  require_model_folder(folder);
  if (fs::exists(folder / "config.json")) require_same_architecture(folder / "config.json", model.config);
  return match_weight_update(Checkpoint::open(folder), model);
}

WeightUpdate match_weight_update(const Checkpoint& checkpoint, const Model& model) {
  ModelWeights weights = model.weights;  // the slots' targets, the model's own views
  const std::vector<WeightSlot> slots = list_weight_slots(model.config, weights);
  std::set<std::string> known;
  for (const WeightSlot& slot : slots) {
    known.insert(slot.name);
    if (slot.fused) known.insert(slot.fused->name);
  }
  WeightUpdate update;
  update.tensors = checkpoint.names();
  JAMBO_REQUIRE(!update.tensors.empty(), "{}: holds no tensors", checkpoint.source());
  for (const std::string& name : update.tensors)
    JAMBO_REQUIRE(known.contains(name), "{}: tensor '{}' is not one the model reads{}", checkpoint.source(), name,
                  !model.config.tie_word_embeddings || name != "lm_head.weight"
                      ? ""
                      : " (its embeddings are tied: update model.embed_tokens.weight)");
  for (const WeightSlot& slot : slots) {
    const std::optional<Source> source = source_of(checkpoint, slot);
    if (!source) continue;
    const TensorView& values = source->values;
    const TensorView& target = *slot.target;
    JAMBO_REQUIRE(values.dtype == target.dtype, "{}: tensor '{}' is {}, the serving model's is {}",
                  checkpoint.source(), source->tensor, dtype_name(values.dtype), dtype_name(target.dtype));
    update.pieces.push_back({slot.name, values, target});
    update.num_bytes += values.numel() * dtype_size(values.dtype);
  }
  update.on_device = checkpoint.on_device();
  if (!update.on_device) checkpoint.require_finite(update.tensors);
  update.storage = checkpoint.storage();
  return update;
}

}  // namespace jambo::model
