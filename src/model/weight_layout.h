// The list of tensors a Jamba model reads (spec §2.1): checkpoint name, expected shape, what the
// tensor is (for random initialisation) and which ModelWeights field receives it. Both the
// checkpoint loader and the random-weight builder walk this one list.
#pragma once

#include "model/weights.h"

#include <optional>
#include <string>
#include <vector>

namespace jambo::model {

// What a tensor is, which decides how random weights fill it.
enum class WeightRole {
  Embedding,   // model.embed_tokens
  LmHead,      // lm_head (untied)
  Linear,      // a projection [out, in] or the conv kernel [Di, 1, K]; fan_in = last dim
  Norm,        // RMSNorm weight
  FinalNorm,   // model.final_layernorm
  Bias,        // a projection or conv bias
  DtBias,      // dt_proj.bias: inverse softplus of the time step
  ALog,        // A_log [Di, N]
  SkipD,       // D [Di]
};

// Where the transformers-5 fused expert layout keeps one expert's matrix (spec §2.2): rows
// [expert * rows_per_expert + first_row, + num_rows) of a [E, rows_per_expert, cols] tensor.
struct FusedExpertSource {
  std::string name;              // e.g. model.layers.1.feed_forward.experts.gate_up_proj
  std::vector<int64_t> shape;    // [E, rows_per_expert, cols]
  int64_t expert = 0;
  int64_t first_row = 0;         // 0 for gate (and down), I for up
  int64_t num_rows = 0;

  // This expert matrix's rows of the stacked tensor (of `shape`).
  TensorView rows_of(const TensorView& stacked) const {
    return stacked.row_slice(expert * shape[1] + first_row, num_rows);
  }
};

struct WeightSlot {
  std::string name;                        // on-disk name (per-expert layout for experts)
  std::vector<int64_t> shape;              // expected shape
  WeightRole role = WeightRole::Linear;
  TensorView* target = nullptr;            // the ModelWeights field this tensor fills
  std::optional<FusedExpertSource> fused;  // set for expert matrices
};

// Sizes `weights` per the config (layers, experts; views already there are kept) and lists every tensor the forward
// reads, in a fixed order. With tied embeddings lm_head has no slot (the caller aliases it to embed_tokens).
std::vector<WeightSlot> list_weight_slots(const JambaConfig& config, ModelWeights& weights);

// Bytes of all slots' views, counting each tensor once (lm_head once when tied).
int64_t total_weight_bytes(const std::vector<WeightSlot>& slots);

}  // namespace jambo::model
