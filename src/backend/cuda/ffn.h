// The feed-forward blocks (spec §3.7, §3.8): the dense SwiGLU MLP and the sparse MoE. MoE routing (softmax
// over the experts, top-k, ties to the lowest index, no renormalization) and the grouping of tokens per expert
// run on the GPU; each expert then runs as cuBLAS GEMMs over its tokens. This slice reads the per-expert token
// counts back to the host (one transfer per MoE layer) to size those GEMMs; grouped GEMMs will remove it.
#pragma once

#include "backend/cuda/device_weights.h"
#include "backend/cuda/gemm.h"

namespace jambo::cuda {

// Scratch of the FFN kernels, grown on demand and kept across layers and steps.
struct FfnWorkspace {
  DeviceBuffer<float> gate;               // [rows, I]
  DeviceBuffer<float> up;                 // [rows, I]
  DeviceBuffer<float> router_logits;      // [T, E]
  DeviceBuffer<int32_t> expert_of;        // [T, k] chosen experts, increasing within a token
  DeviceBuffer<float> weight_of;          // [T, k] their router probabilities
  DeviceBuffer<int32_t> position_of;      // [T, k] row of each (token, choice) in the grouped expert inputs
  DeviceBuffer<int32_t> routed_token;     // [T*k] token of each grouped row
  DeviceBuffer<int64_t> expert_rows;      // [E + 1] first grouped row of each expert, then the total
  DeviceBuffer<float> expert_input;       // [T*k, H]
  DeviceBuffer<float> expert_output;      // [T*k, H]
  std::vector<int64_t> host_expert_rows;  // [E + 1]
};

// out = down(silu(gate(x)) * up(x)).
void dense_mlp(Gemm& gemm, const DeviceMlp& mlp,
               const float* x,  // [num_rows, H]
               int64_t num_rows,
               float* out,  // [num_rows, H]
               FfnWorkspace& workspace, cudaStream_t stream);

// out[t] = sum over the top-k experts e of softmax(router(x[t]))[e] * expert_e(x[t]), added in increasing
// expert index into zeros (as the CPU backend).
void sparse_moe(Gemm& gemm, const DeviceMoe& moe, int64_t num_experts_per_tok,
                const float* x,  // [num_tokens, H]
                int64_t num_tokens,
                float* out,  // [num_tokens, H]
                FfnWorkspace& workspace, cudaStream_t stream);

}  // namespace jambo::cuda
