// Test helpers: a tiny Jamba checkpoint written from the names and shapes of spec §2.1 (listed
// here independently of the loader), temporary folders, and a walk over all tensors of a model.
#pragma once

#include "model/weight_layout.h"
#include "model/weights.h"
#include "safetensors_writer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <utility>

namespace jambo::model_test {

namespace fs = std::filesystem;

// A fresh folder under the system temp directory, removed with everything in it at scope exit.
class TempFolder {
 public:
  TempFolder() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    static int num_made = 0;  // several folders in one test must differ
    std::string name = fmt::format("jambo-{}-{}-{}-{}", ::getpid(), test->test_suite_name(),
                                   test->name(), num_made++);
    std::replace(name.begin(), name.end(), '/', '_');  // parameterized tests have '/' in names
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempFolder() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// Tiny shape: H 16, I 24, V 32, 4 layers (attention at 1 and 3, MoE at 0 and 3), 4 heads and 2 KV
// heads (hd 4), 3 experts, N 4, K 3, expand 2 (Di 32), dt_rank "auto" (1), all Mamba biases.
constexpr int64_t kH = 16, kI = 24, kV = 32, kL = 4, kKvRows = 8, kE = 3, kN = 4, kK = 3, kDi = 32, kR = 1;

inline nlohmann::json tiny_config_json() {
  return {{"model_type", "jamba"},        {"vocab_size", kV},          {"hidden_size", kH},
          {"intermediate_size", kI},      {"num_hidden_layers", kL},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2},     {"num_experts", kE},         {"num_experts_per_tok", 2},
          {"attn_layer_period", 2},       {"attn_layer_offset", 1},    {"expert_layer_period", 3},
          {"expert_layer_offset", 0},     {"mamba_d_state", kN},       {"mamba_d_conv", kK},
          {"mamba_expand", 2},            {"mamba_dt_rank", "auto"},   {"mamba_proj_bias", true},
          {"mamba_conv_bias", true},      {"tie_word_embeddings", false}};
}

// Element i of a named tensor: multiples of 1/16 in [-1.875, 1.875], exact in every dtype.
inline float test_value(const std::string& name, int64_t i) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : name) hash = (hash ^ c) * 0x100000001b3ull;
  return float(int64_t((hash + uint64_t(i) * 7) % 61) - 30) / 16.0f;
}

inline std::vector<float> test_values(const std::string& name, int64_t count) {
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i) out[i] = test_value(name, i);
  return out;
}

enum class ExpertLayout { PerExpert, Fused };

class TinyCheckpoint {
 public:
  DType dtype = DType::F32;
  ExpertLayout experts = ExpertLayout::PerExpert;
  bool tied = false;

  std::vector<TestTensor> tensors() const {
    std::vector<TestTensor> out;
    add(out, "model.embed_tokens.weight", {kV, kH});
    for (int64_t i = 0; i < kL; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      add(out, p + "input_layernorm.weight", {kH});
      add(out, p + "pre_ff_layernorm.weight", {kH});
      if (i % 2 == 1) {
        add_attention(out, p + "self_attn.");
      } else {
        add_mamba(out, p + "mamba.");
      }
      if (i % 3 == 0) {
        add_moe(out, p + "feed_forward.");
      } else {
        add_mlp(out, p + "feed_forward.");
      }
    }
    add(out, "model.final_layernorm.weight", {kH});
    if (!tied) add(out, "lm_head.weight", {kV, kH});
    return out;
  }

  nlohmann::json config() const {
    nlohmann::json config = tiny_config_json();
    config["tie_word_embeddings"] = tied;
    return config;
  }

  void write(const fs::path& folder) const {
    write_text(folder / "config.json", config().dump(2));
    write_safetensors(folder / "model.safetensors", tensors());
  }

 private:
  void add(std::vector<TestTensor>& out, const std::string& name, std::vector<int64_t> shape) const {
    int64_t numel = 1;
    for (int64_t extent : shape) numel *= extent;
    out.push_back(make_tensor(name, dtype, std::move(shape), test_values(name, numel)));
  }

  void add_attention(std::vector<TestTensor>& out, const std::string& p) const {
    add(out, p + "q_proj.weight", {kH, kH});
    add(out, p + "k_proj.weight", {kKvRows, kH});
    add(out, p + "v_proj.weight", {kKvRows, kH});
    add(out, p + "o_proj.weight", {kH, kH});
  }

  void add_mamba(std::vector<TestTensor>& out, const std::string& p) const {
    add(out, p + "in_proj.weight", {2 * kDi, kH});
    add(out, p + "in_proj.bias", {2 * kDi});
    add(out, p + "conv1d.weight", {kDi, 1, kK});
    add(out, p + "conv1d.bias", {kDi});
    add(out, p + "x_proj.weight", {kR + 2 * kN, kDi});
    add(out, p + "dt_layernorm.weight", {kR});
    add(out, p + "b_layernorm.weight", {kN});
    add(out, p + "c_layernorm.weight", {kN});
    add(out, p + "dt_proj.weight", {kDi, kR});
    add(out, p + "dt_proj.bias", {kDi});
    add(out, p + "A_log", {kDi, kN});
    add(out, p + "D", {kDi});
    add(out, p + "out_proj.weight", {kH, kDi});
    add(out, p + "out_proj.bias", {kH});
  }

  void add_mlp(std::vector<TestTensor>& out, const std::string& p) const {
    add(out, p + "gate_proj.weight", {kI, kH});
    add(out, p + "up_proj.weight", {kI, kH});
    add(out, p + "down_proj.weight", {kH, kI});
  }

  // Per-expert names, or the fused [E, 2I, H] gate_up_proj and [E, H, I] down_proj built from the
  // same per-expert values (gate rows first, then up rows, per expert).
  void add_moe(std::vector<TestTensor>& out, const std::string& p) const {
    add(out, p + "router.weight", {kE, kH});
    if (experts == ExpertLayout::PerExpert) {
      for (int64_t e = 0; e < kE; ++e) add_mlp(out, fmt::format("{}experts.{}.", p, e));
      return;
    }
    std::vector<float> gate_up, down;
    for (int64_t e = 0; e < kE; ++e) {
      const std::string expert = fmt::format("{}experts.{}.", p, e);
      for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
        const std::vector<float> values = test_values(expert + part, kI * kH);
        gate_up.insert(gate_up.end(), values.begin(), values.end());
      }
      const std::vector<float> values = test_values(expert + "down_proj.weight", kH * kI);
      down.insert(down.end(), values.begin(), values.end());
    }
    out.push_back(make_tensor(p + "experts.gate_up_proj", dtype, {kE, 2 * kI, kH}, gate_up));
    out.push_back(make_tensor(p + "experts.down_proj", dtype, {kE, kH, kI}, down));
  }
};

// Every tensor field of a model in a fixed order (empty views included), to compare models whole.
inline std::vector<const TensorView*> all_tensors(const model::ModelWeights& w) {
  std::vector<const TensorView*> out = {&w.embed_tokens, &w.final_norm, &w.lm_head};
  for (const model::LayerWeights& layer : w.layers) {
    const model::AttentionWeights& a = layer.attention;
    const model::MambaWeights& m = layer.mamba;
    for (const TensorView* v :
         {&layer.input_norm, &layer.pre_ff_norm, &a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj,
          &m.in_proj, &m.in_proj_bias, &m.conv_weight, &m.conv_bias, &m.x_proj, &m.dt_norm,
          &m.b_norm, &m.c_norm, &m.dt_proj, &m.dt_proj_bias, &m.A_log, &m.D, &m.out_proj,
          &m.out_proj_bias, &layer.mlp.gate_proj, &layer.mlp.up_proj, &layer.mlp.down_proj,
          &layer.moe.router})
      out.push_back(v);
    for (const model::MlpWeights& expert : layer.moe.experts)
      for (const TensorView* v : {&expert.gate_proj, &expert.up_proj, &expert.down_proj}) out.push_back(v);
  }
  return out;
}

// The values of a view in fp32; none for an empty (absent) view.
inline std::vector<float> values_of(const TensorView& view) {
  if (view.empty()) return {};
  std::vector<float> out(view.numel());
  for (int64_t i = 0; i < view.numel(); ++i) out[i] = view.at(i);
  return out;
}

// A model's weights as checkpoint tensors under their per-expert names, those named in `only` alone where it is
// not empty: a weight update's folder (write_safetensors(folder / "model.safetensors", ...)).
inline std::vector<TestTensor> weight_tensors(const model::Model& model, const std::set<std::string>& only = {}) {
  model::ModelWeights weights = model.weights;
  std::vector<TestTensor> tensors;
  for (const model::WeightSlot& slot : model::list_weight_slots(model.config, weights)) {
    if (!only.empty() && !only.contains(slot.name)) continue;
    const TensorView& view = *slot.target;
    TestTensor tensor{slot.name, std::string(dtype_name(view.dtype)), view.shape, {}};
    tensor.bytes.resize(size_t(view.numel() * dtype_size(view.dtype)));
    std::memcpy(tensor.bytes.data(), view.data, tensor.bytes.size());
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

// `base` with the weights named in `names` taken from `donor` (the same architecture): what a partial update of
// those weights should serve.
inline model::Model with_weights_from(const model::Model& base, const model::Model& donor,
                                      const std::set<std::string>& names) {
  model::Model mixed = base;
  model::ModelWeights donor_weights = donor.weights;
  const std::vector<model::WeightSlot> donor_slots = model::list_weight_slots(donor.config, donor_weights);
  for (const model::WeightSlot& slot : model::list_weight_slots(mixed.config, mixed.weights))
    if (names.contains(slot.name))
      for (const model::WeightSlot& donor_slot : donor_slots)
        if (donor_slot.name == slot.name) *slot.target = *donor_slot.target;
  if (mixed.config.tie_word_embeddings) mixed.weights.lm_head = mixed.weights.embed_tokens;
  mixed.storage =
      std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(base.storage, donor.storage);
  return mixed;
}

}  // namespace jambo::model_test
