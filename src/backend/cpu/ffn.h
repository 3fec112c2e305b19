// The feed-forward blocks (spec §3.7, §3.8): dense SwiGLU MLP and sparse MoE.
#pragma once

#include "backend/cpu/matrix.h"
#include "model/weights.h"

namespace jambo::cpu {

// out = down(silu(gate(x)) * up(x)).
void dense_mlp(const MlpWeights& weights,
               const Matrix& x,   // [num_tokens, H]
               Matrix& out);      // [num_tokens, H]

// out[t] = sum over the top-k experts e of softmax(router(x[t]))[e] * expert_e(x[t]), without
// renormalizing the k weights, added in increasing expert index. Ties pick the lowest index.
void sparse_moe(const MoeWeights& weights, int64_t num_experts_per_tok,
                const Matrix& x,  // [num_tokens, H]
                Matrix& out);     // [num_tokens, H]

}  // namespace jambo::cpu
