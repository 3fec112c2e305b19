// Tensor names and shapes of spec §2.1 (per-expert layout) and §2.2 (fused expert layout).
#include "model/weight_layout.h"

#include <fmt/format.h>

namespace jambo::model {
namespace {

// Appends slots with a common name prefix, e.g. "model.layers.3.mamba.".
class SlotList {
 public:
  explicit SlotList(std::vector<WeightSlot>& slots) : slots_(slots) {}

  void add(std::string name, std::vector<int64_t> shape, WeightRole role, TensorView& target) {
    slots_.push_back(WeightSlot{std::move(name), std::move(shape), role, &target, std::nullopt});
  }

  void add_expert(std::string name, std::vector<int64_t> shape, TensorView& target,
                  FusedExpertSource fused) {
    slots_.push_back(
        WeightSlot{std::move(name), std::move(shape), WeightRole::Linear, &target, std::move(fused)});
  }

 private:
  std::vector<WeightSlot>& slots_;
};

void add_attention(const JambaConfig& c, const std::string& prefix, AttentionWeights& w,
                   SlotList& slots) {
  const int64_t q_rows = c.num_attention_heads * c.head_dim;
  const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
  slots.add(prefix + "q_proj.weight", {q_rows, c.hidden_size}, WeightRole::Linear, w.q_proj);
  slots.add(prefix + "k_proj.weight", {kv_rows, c.hidden_size}, WeightRole::Linear, w.k_proj);
  slots.add(prefix + "v_proj.weight", {kv_rows, c.hidden_size}, WeightRole::Linear, w.v_proj);
  slots.add(prefix + "o_proj.weight", {c.hidden_size, q_rows}, WeightRole::Linear, w.o_proj);
}

void add_mamba(const JambaConfig& c, const std::string& prefix, MambaWeights& w, SlotList& slots) {
  const int64_t H = c.hidden_size, Di = c.mamba_d_inner, N = c.mamba_d_state;
  const int64_t K = c.mamba_d_conv, R = c.mamba_dt_rank;
  slots.add(prefix + "in_proj.weight", {2 * Di, H}, WeightRole::Linear, w.in_proj);
  if (c.mamba_proj_bias) slots.add(prefix + "in_proj.bias", {2 * Di}, WeightRole::Bias, w.in_proj_bias);
  slots.add(prefix + "conv1d.weight", {Di, 1, K}, WeightRole::Linear, w.conv_weight);
  if (c.mamba_conv_bias) slots.add(prefix + "conv1d.bias", {Di}, WeightRole::Bias, w.conv_bias);
  slots.add(prefix + "x_proj.weight", {R + 2 * N, Di}, WeightRole::Linear, w.x_proj);
  slots.add(prefix + "dt_layernorm.weight", {R}, WeightRole::Norm, w.dt_norm);
  slots.add(prefix + "b_layernorm.weight", {N}, WeightRole::Norm, w.b_norm);
  slots.add(prefix + "c_layernorm.weight", {N}, WeightRole::Norm, w.c_norm);
  slots.add(prefix + "dt_proj.weight", {Di, R}, WeightRole::Linear, w.dt_proj);
  slots.add(prefix + "dt_proj.bias", {Di}, WeightRole::DtBias, w.dt_proj_bias);
  slots.add(prefix + "A_log", {Di, N}, WeightRole::ALog, w.A_log);
  slots.add(prefix + "D", {Di}, WeightRole::SkipD, w.D);
  slots.add(prefix + "out_proj.weight", {H, Di}, WeightRole::Linear, w.out_proj);
  if (c.mamba_proj_bias) slots.add(prefix + "out_proj.bias", {H}, WeightRole::Bias, w.out_proj_bias);
}

void add_dense_mlp(const JambaConfig& c, const std::string& prefix, MlpWeights& w, SlotList& slots) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  slots.add(prefix + "gate_proj.weight", {I, H}, WeightRole::Linear, w.gate_proj);
  slots.add(prefix + "up_proj.weight", {I, H}, WeightRole::Linear, w.up_proj);
  slots.add(prefix + "down_proj.weight", {H, I}, WeightRole::Linear, w.down_proj);
}

void add_moe(const JambaConfig& c, const std::string& prefix, MoeWeights& w, SlotList& slots) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts;
  slots.add(prefix + "router.weight", {E, H}, WeightRole::Linear, w.router);
  w.experts.resize(E);
  const std::string gate_up = prefix + "experts.gate_up_proj";
  const std::string down = prefix + "experts.down_proj";
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = fmt::format("{}experts.{}.", prefix, e);
    MlpWeights& mlp = w.experts[e];
    slots.add_expert(expert + "gate_proj.weight", {I, H}, mlp.gate_proj,
                     {gate_up, {E, 2 * I, H}, e, 0, I});
    slots.add_expert(expert + "up_proj.weight", {I, H}, mlp.up_proj,
                     {gate_up, {E, 2 * I, H}, e, I, I});
    slots.add_expert(expert + "down_proj.weight", {H, I}, mlp.down_proj, {down, {E, H, I}, e, 0, H});
  }
}

}  // namespace

std::vector<WeightSlot> list_weight_slots(const JambaConfig& config, ModelWeights& weights) {
  std::vector<WeightSlot> slots;
  SlotList list(slots);
  const int64_t H = config.hidden_size, V = config.vocab_size;
  list.add("model.embed_tokens.weight", {V, H}, WeightRole::Embedding, weights.embed_tokens);
  weights.layers.resize(config.num_hidden_layers);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string prefix = fmt::format("model.layers.{}.", i);
    LayerWeights& layer = weights.layers[i];
    layer.mixer = config.mixer_kinds[i];
    layer.ffn = config.ffn_kinds[i];
    list.add(prefix + "input_layernorm.weight", {H}, WeightRole::Norm, layer.input_norm);
    if (layer.mixer == MixerKind::Attention) {
      add_attention(config, prefix + "self_attn.", layer.attention, list);
    } else {
      add_mamba(config, prefix + "mamba.", layer.mamba, list);
    }
    list.add(prefix + "pre_ff_layernorm.weight", {H}, WeightRole::Norm, layer.pre_ff_norm);
    if (layer.ffn == FfnKind::Moe) {
      add_moe(config, prefix + "feed_forward.", layer.moe, list);
    } else {
      add_dense_mlp(config, prefix + "feed_forward.", layer.mlp, list);
    }
  }
  list.add("model.final_layernorm.weight", {H}, WeightRole::FinalNorm, weights.final_norm);
  if (!config.tie_word_embeddings)
    list.add("lm_head.weight", {V, H}, WeightRole::LmHead, weights.lm_head);
  return slots;
}

int64_t total_weight_bytes(const std::vector<WeightSlot>& slots) {
  int64_t bytes = 0;
  for (const WeightSlot& slot : slots) bytes += slot.target->numel() * dtype_size(slot.target->dtype);
  return bytes;
}

}  // namespace jambo::model
