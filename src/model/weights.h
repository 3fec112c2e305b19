// The weights of a Jamba model as typed views, one struct per layer part. Views point into the
// safetensors mmap (or into random storage made by --random-weights); shapes are checked at load. A model from
// describe_random_model has views without host data: its weights are generated where they are held.
#pragma once

#include "core/tensor.h"
#include "model/config.h"

#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

namespace jambo::model {

class RandomWeights;  // model/random_weights.h

struct AttentionWeights {
  TensorView q_proj;  // [nh*hd, H]
  TensorView k_proj;  // [nkv*hd, H]
  TensorView v_proj;  // [nkv*hd, H]
  TensorView o_proj;  // [H, nh*hd]
};

struct MambaWeights {
  TensorView in_proj;       // [2*Di, H]; rows 0..Di-1 -> u, Di..2Di-1 -> gate z
  TensorView in_proj_bias;  // [2*Di] or empty
  TensorView conv_weight;   // [Di, 1, K]
  TensorView conv_bias;     // [Di] or empty
  TensorView x_proj;        // [R + 2N, Di]; output split (dt, B, C)
  TensorView dt_norm;       // [R]
  TensorView b_norm;        // [N]
  TensorView c_norm;        // [N]
  TensorView dt_proj;       // [Di, R]
  TensorView dt_proj_bias;  // [Di]
  TensorView A_log;         // [Di, N]
  TensorView D;             // [Di]
  TensorView out_proj;      // [H, Di]
  TensorView out_proj_bias; // [H] or empty
};

// One SwiGLU MLP: down(silu(gate(x)) * up(x)). For fused checkpoints gate and up are row slices
// of experts.gate_up_proj[e].
struct MlpWeights {
  TensorView gate_proj;  // [I, H]
  TensorView up_proj;    // [I, H]
  TensorView down_proj;  // [H, I]
};

struct MoeWeights {
  TensorView router;               // [E, H]
  std::vector<MlpWeights> experts; // [E]
};

struct LayerWeights {
  MixerKind mixer = MixerKind::Mamba;
  FfnKind ffn = FfnKind::Dense;
  TensorView input_norm;     // [H]
  TensorView pre_ff_norm;    // [H]
  AttentionWeights attention;  // when mixer == Attention
  MambaWeights mamba;          // when mixer == Mamba
  MlpWeights mlp;              // when ffn == Dense
  MoeWeights moe;              // when ffn == Moe
};

struct ModelWeights {
  TensorView embed_tokens;   // [V, H]
  std::vector<LayerWeights> layers;
  TensorView final_norm;     // [H]
  TensorView lm_head;        // [V, H]; the embedding itself when tied
  int64_t bytes_total = 0;   // bytes of all weights the forward reads (for GB/s figures)
};

// A loaded model: its config, its weights and whatever owns their memory.
struct Model {
  JambaConfig config;
  ModelWeights weights;
  std::shared_ptr<void> storage;  // keeps the mmaps or random buffers alive
  // Set when the views carry no host data (describe_random_model): how to generate each tensor. The views
  // then point into an address range that cannot be read, so that a host read faults instead of reading junk.
  std::shared_ptr<const RandomWeights> random_recipe;

  bool has_host_data() const { return random_recipe == nullptr; }
};

// Throws jambo::Error when the model's weights have no host data, naming `reader` (what needed them).
void require_host_data(const Model& model, std::string_view reader);

// Loads config.json and model.safetensors (or a sharded index) from a folder. Warns on stderr about
// tensors the model does not use. Throws jambo::Error naming the file and tensor or field, and for a tensor the
// model reads that holds NaN or infinity, its first such element.
Model load_model(const std::filesystem::path& folder);

// A model with the folder's config.json and seeded random weights, scaled like a trained model.
Model make_random_model(const JambaConfig& config, DType dtype, uint64_t seed);

// The same model without host data: names, shapes and dtypes as make_random_model's, and a random_recipe from
// which the CUDA backend generates the same bits on the GPU (a 52B model then needs no 100 GB of host memory).
Model describe_random_model(const JambaConfig& config, DType dtype, uint64_t seed);

}  // namespace jambo::model
