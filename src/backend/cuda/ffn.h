// The feed-forward blocks (spec §3.7, §3.8): the dense SwiGLU MLP and the sparse MoE. MoE routing (softmax
// over the experts, top-k, ties to the lowest index, no renormalization) and the grouping of tokens per expert
// run on the GPU. The experts' GEMMs then run grouped (skinny_gemm.h: one launch for all experts, counts left
// on the GPU) for steps of up to kMaxGroupedTokens tokens, decode steps of up to that batch among them, so that
// those stay one CUDA graph; larger steps read the counts back (one transfer per MoE layer) and run each expert
// as cuBLAS GEMMs, whose tensor-core tiles win once the experts have more rows than a pass or two of skinny_gemm.
#pragma once

#include "backend/cuda/device_weights.h"
#include "backend/cuda/gemm.h"

namespace jambo::backend::cuda {

// Scratch of the FFN kernels, grown on demand and kept across layers and steps.
struct FfnWorkspace {
  DeviceBuffer<float> gate_up;            // [rows, 2I] gate, then up
  DeviceBuffer<float> activation;         // [rows, I] silu(gate) * up
  DeviceBuffer<uint16_t> activation16;    // [rows, I] the same rounded for a 16-bit down_proj
  DeviceBuffer<float> router_logits;      // [T, E]
  DeviceBuffer<int32_t> expert_of;        // [T, k] chosen experts, increasing within a token
  DeviceBuffer<float> weight_of;          // [T, k] their router probabilities
  DeviceBuffer<int32_t> position_of;      // [T, k] row of each (token, choice) in the grouped expert inputs
  DeviceBuffer<int32_t> routed_token;     // [T*k] token of each grouped row
  DeviceBuffer<int64_t> expert_rows;      // [E + 1] first grouped row of each expert, then the total
  DeviceBuffer<int32_t> active_experts;   // [min(E, T*k)] the experts with rows, increasing, then -1s
  DeviceBuffer<float> expert_input;       // [T*k, H]
  DeviceBuffer<float> expert_output;      // [T*k, H]
  std::vector<int64_t> host_expert_rows;  // [E + 1]
};

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, I + i] (swiglu_value, the arithmetic of the GEMM's fused SwiGLU);
// out16, when present, gets the same rounded.
void swiglu(const float* gate_up,  // [num_rows, 2I] gate, then up
            int64_t num_rows, int64_t intermediate,
            float* out,  // [num_rows, I], or null where out16 suffices
            cudaStream_t stream, const Narrow16& out16 = {});

// out = down(silu(gate(x)) * up(x)). x16: x rounded by its producer (gemm.h), or absent.
void dense_mlp(Gemm& gemm, const DeviceMlp& mlp,
               const float* x,  // [num_rows, H]
               int64_t num_rows,
               float* out,  // [num_rows, H]
               FfnWorkspace& workspace, cudaStream_t stream, const Narrow16& x16 = {});

// Where sparse_moe's routing of a step's T tokens to their k experts lies (buffers of the FfnWorkspace).
struct ExpertRouting {
  int32_t* expert_of = nullptr;       // [T, k] chosen experts, increasing within a token
  float* weight_of = nullptr;         // [T, k] their router probabilities
  int32_t* position_of = nullptr;     // [T, k] row of each (token, choice) in the grouped expert inputs
  int32_t* routed_token = nullptr;    // [T*k] token of each grouped row
  int64_t* expert_rows = nullptr;     // [E + 1] first grouped row of each expert, then the total
  int32_t* active_experts = nullptr;  // [min(E, T*k)] the experts with rows, increasing, then -1s
};

// A token's routing is its own (row-invariant): softmax over its router logits in expert order, top-k by repeated
// arg-max (ties to the lowest index). The grouping places each expert's tokens in token order, so a token's grouped
// rows move with the batch, but they hold its own input.
void route_tokens(const float* router_logits,  // [T, E]
                  int64_t num_tokens, int64_t num_experts, int64_t k, const ExpertRouting& routing,
                  cudaStream_t stream);

// out[t] = sum over t's k choices, in increasing expert order, of weight_of * expert_output at position_of.
void combine_experts(const float* expert_output,  // [T*k, H]
                     const ExpertRouting& routing, int64_t num_tokens, int64_t k, int64_t hidden_size,
                     float* out,  // [T, H]
                     cudaStream_t stream);

constexpr int64_t kMaxGroupedTokens = 32;

// How the experts' GEMMs run: by the step's token count as above, or (for tests) one way regardless; or, for an
// invariant Gemm, Invariant: the invariant GEMM grouped by expert (tensor_gemm_grouped), the counts on the GPU, each
// row the bits of its expert's GEMM alone (PerExpert's on an invariant Gemm), at any token count.
enum class ExpertGemms { ByTokenCount, Grouped, PerExpert, Invariant };

// The experts' GEMMs that a Gemm takes: by token count, or Invariant for an invariant one, since the grouped skinny
// GEMM sums in another order than the invariant GEMM.
inline ExpertGemms expert_gemms_of(const Gemm& gemm) {
  return gemm.invariant() ? ExpertGemms::Invariant : ExpertGemms::ByTokenCount;
}

// Whether sparse_moe runs these experts grouped for a step of num_tokens tokens (else it reads the expert counts
// back to the host): always for Invariant; else by the token count, or as asked, where skinny_gemm takes the
// experts' shapes (K a multiple of one 16-byte load).
bool experts_run_grouped(const DeviceMoe& moe, int64_t num_tokens, ExpertGemms gemms = ExpertGemms::ByTokenCount);

// out[t] = sum over the top-k experts e of softmax(router(x[t]))[e] * expert_e(x[t]), added in increasing
// expert index into zeros (as the CPU backend).
void sparse_moe(Gemm& gemm, const DeviceMoe& moe, int64_t num_experts_per_tok,
                const float* x,  // [num_tokens, H]
                int64_t num_tokens,
                float* out,  // [num_tokens, H]
                FfnWorkspace& workspace, cudaStream_t stream, const Narrow16& x16 = {},
                ExpertGemms gemms = ExpertGemms::ByTokenCount);

}  // namespace jambo::backend::cuda
