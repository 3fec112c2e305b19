// An independent, plain double-precision Jamba forward over a whole sequence (spec §3), without
// any cache: the oracle the CPU backend is tested against. Written for clarity, not speed.
#pragma once

#include "model/weights.h"

#include <vector>

namespace jambo::naive {

using Rows = std::vector<std::vector<double>>;  // [num_tokens][width]

Rows linear(const Rows& x, const TensorView& weight, const TensorView& bias = {});
Rows rms_norm(const Rows& x, const TensorView& weight, double eps);
Rows mamba(const model::MambaWeights& weights, const model::JambaConfig& config, const Rows& x);
Rows attention(const model::AttentionWeights& weights, const model::JambaConfig& config, const Rows& x);
Rows mlp(const model::MlpWeights& weights, const Rows& x);
Rows moe(const model::MoeWeights& weights, int64_t num_experts_per_tok, const Rows& x);

// Logits of every position of the sequence: [num_tokens][V].
Rows forward(const model::Model& model, const std::vector<int32_t>& tokens);

}  // namespace jambo::naive
