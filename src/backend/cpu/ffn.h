// The feed-forward blocks (spec §3.7, §3.8): dense SwiGLU MLP and sparse MoE.
#pragma once

#include "backend/cpu/matrix.h"
#include "model/weights.h"

namespace jambo::backend::cpu {

// out = down(silu(gate(x)) * up(x)).
void dense_mlp(const model::MlpWeights& weights,
               const Matrix& x,  // [num_tokens, H]
               Matrix& out);     // [num_tokens, H]

// out[t] = sum over the top-k experts e of softmax(router(x[t]))[e] * expert_e(x[t]), without
// renormalizing the k weights, added in increasing expert index. Ties pick the lowest index. The chosen experts go
// to `experts` where given.
void sparse_moe(const model::MoeWeights& weights, int64_t num_experts_per_tok,
                const Matrix& x,                    // [num_tokens, H]
                Matrix& out,                        // [num_tokens, H]
                int32_t* experts = nullptr);        // [num_tokens, k] each token's, in increasing order

}  // namespace jambo::backend::cpu
