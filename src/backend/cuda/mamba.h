// The Mamba mixer's own kernels (spec §3.5): the causal depthwise conv1d and the selective scan, over
// all rows of a step in one launch each, reading and writing each row's slot in the state pool in place.
// A row whose reads_state is 0 starts from a zero conv tail and a zero SSM state and never reads its
// slot (law 1); every row's new tail and final state are written into its slot, and its state after each checkpoint
// inside it (DeviceRows::checkpoint_tokens) into that checkpoint's slot, as the conv and the scan pass it.
#pragma once

#include "backend/cuda/device_rows.h"
#include "backend/cuda/narrow16.h"
#include "backend/state_values.h"
#include "core/host_device.h"

namespace jambo::backend::cuda {

// Sizes of one Mamba layer and where its state lies inside a slot.
struct MambaStateLayout {
  int64_t num_channels = 0;  // Di
  int64_t kernel_size = 0;   // K
  int64_t state_size = 0;    // N
  int64_t layer_offset = 0;  // elements from a slot's start to this layer's conv tail [Di, K-1];
                             // its SSM state [Di, N] follows the tail
};

constexpr int64_t kMaxConvTaps = 8;  // K (d_conv): a channel's window is held in registers

// A decode step's conv run by the in_proj GEMM as it finishes each input u (SkinnyGemm::conv, conv_step.cuh): the
// same outputs, new tails and 16-bit copies as causal_conv1d, without its launch. Every row is one token.
struct DecodeConv {
  DeviceRows rows;
  MambaStateLayout layout;
  const float* weight = nullptr;  // [Di, K]
  const float* bias = nullptr;    // [Di] or null
  StateValues state_pool;         // [num_slots, elements_per_slot]
  float* activated = nullptr;     // [T, Di]
  Narrow16 activated16;           // [T, Di] or absent
  JAMBO_HOST_DEVICE bool present() const { return weight != nullptr; }
};

// activated[t, c] = silu(conv_bias[c] + sum_j conv_weight[c, j] * window[i + j]) where i is the token's index in
// its row and window is the row's conv tail (zeros without state) followed by the row's inputs u. Then the last
// K-1 entries of each row's window become its new tail. One launch for the outputs of every (token, channel),
// which also shifts the tails of rows of one token, then, unless every row has one token (decode), one for the
// tails of the longer rows. activated16, when present, gets activated rounded for a 16-bit x_proj (narrow16.h).
void causal_conv1d(const DeviceRows& rows, const MambaStateLayout& layout,
                   const float* projected,       // [T, 2*Di]; columns 0..Di-1 are u
                   const float* conv_weight,     // [Di, K]
                   const float* conv_bias,       // [Di] or null
                   StateValues state_pool,       // [num_slots, elements_per_slot]
                   float* activated,             // [T, Di]
                   const Narrow16& activated16,  // [T, Di] or absent
                   cudaStream_t stream);

// The selective scan in fp32, with the dt bias and softplus, the D skip and the SiLU gate fused:
//   delta = softplus(delta_raw + dt_bias); h = exp(delta * A) * h + delta * B * u;
//   gated = (h · C + D * u) * silu(z).
// h starts from the slot (reads_state) or zero and the final h is written back into the slot. Invariant
// (docs/DESIGN.md, "GPU invariance"): every token of a row is one step of one recurrence, in time order, whether
// the row has one token (decode: a kernel of its own, two lanes per (row, channel)) or several (prefill: a block per
// row and 16 or 32 channels, 8 or 4 lanes per channel); both advance h with the same pinned update and sum the
// readout h · C in the same tree, so a token's output and state are the same bits in any step, beside any rows,
// however its prompt was cut. A bf16 state is rounded where each step ends, as on the CPU.
void selective_scan(const DeviceRows& rows, const MambaStateLayout& layout,
                    const float* activated,  // [T, Di] u after the conv and SiLU
                    const float* delta_raw,  // [T, Di] dt_proj output before its bias
                    const float* dt_bias,    // [Di]
                    const float* selective,  // [T, selective_stride] the normalized B at column b_column, C after it
                    int64_t selective_stride, int64_t b_column,
                    const float* projected,   // [T, 2*Di]; columns Di..2Di-1 are z
                    const float* a,           // [Di, N] A = -exp(A_log)
                    const float* d,           // [Di]
                    StateValues state_pool,   // [num_slots, elements_per_slot]
                    float* gated,             // [T, Di], or null where gated16 suffices
                    const Narrow16& gated16,  // [T, Di] gated rounded for a 16-bit out_proj, or absent
                    cudaStream_t stream);

}  // namespace jambo::backend::cuda
