// GEMMs of few rows (decode): y = x · wᵀ streamed at the weights' bandwidth, one warp per output row of w (four
// where a dense GEMM has few outputs) with 16-byte weight loads, several per lane in flight, and up to kSkinnyRows
// rows of x per pass over the weights. Rows come in groups, each with its own weight: the MoE experts, whose row
// counts stay on the GPU (one launch for all experts, no transfer to the host, so that a MoE decode step stays one
// CUDA graph; only the experts listed in group_ids get blocks), or one group of num_rows rows (a dense GEMM). 16-bit
// weights multiply x rounded to their type as it is read (what the cuBLAS path's narrowing gives, without its launch),
// fp32 weights multiply x as it is; fp32 accumulation. A dense GEMM of a row or two can also do the work of a small
// kernel after it in a decode step, which would cost a launch and a dependent wait: SwiGLU over its outputs
// (swiglu) or the Mamba conv of the inputs among them (conv). H200, 3B shape, batch 1, GPU time in the layers: 2.48
// ms a step without them, 2.37-2.41 with both. Fusing dt's RMSNorm into dt_proj, or dt_proj into the state update,
// made the step slower: the work they add sits on the consumer's critical path and costs more than the launch.
// Every instantiation adds a row's products in one pinned order (add_four_products), so a row's sums do not depend
// on the pass it shares; the warps an output takes still follow N, and linear() leaves this kernel past two rows.
#pragma once

#include "backend/cuda/device_memory.h"
#include "backend/cuda/mamba.h"
#include "backend/cuda/narrow16.h"
#include "core/dtype.h"

#include <cstdint>

namespace jambo::backend::cuda {

constexpr int64_t kSkinnyRows = 8;

// A dense GEMM (one group) of at most this many rows of x takes one pass over the weights, the only launch with an
// epilogue; linear() (gemm.h) runs 16-bit weights with this many rows or fewer here rather than in cuBLAS.
constexpr int64_t kMaxSkinnyGemmRows = 2;

// Below this many outputs (8 warps per SM of an H200's 132), a dense GEMM of one or two rows takes four warps per
// output, summed in warp order; from here on, and always with SwiGLU, one.
constexpr int64_t kMinOutputsOfOneWarp = 8 * 132;

struct SkinnyGemm {
  const float* x = nullptr;              // [R, x_stride] groups of rows, the first k columns read
  int64_t x_stride = 0;                  // elements from one row of x to the next (>= K)
  const uint16_t* x16 = nullptr;         // [R, K] x rounded to the 16-bit weights' type by its producer, read
                                         //   instead of x when set (one group of up to 2 rows); or null
  const int64_t* group_rows = nullptr;   // [G + 1] on the GPU: group g's rows are [group_rows[g], group_rows[g + 1]);
  int64_t num_rows = 0;                  //   or, when null, one group of num_rows rows
  const int32_t* group_ids = nullptr;    // [num_groups] on the GPU, beside group_rows: launch row i takes group
                                         //   group_ids[i] (none where -1), so that groups without rows need no
                                         //   blocks; or, when null, launch row i takes group i
  const void* const* weights = nullptr;  // [G] on the GPU: group g's weight [N, K], nn.Linear layout; or, when null,
  const void* weight = nullptr;          //   this one weight for the one group
  DType dtype = DType::F32;              // of every weight
  int64_t num_groups = 1, n = 0, k = 0;  // launch rows (G without group_ids), N, K
  float* y = nullptr;                    // [R, N], or [R, N/2] with swiglu (null there where y16 suffices)
  // SwiGLU fused (an MLP's stacked gate_up at decode): w's rows [0, N/2) are the gates, [N/2, N) the ups, and
  // y[m, i] = silu(gate) * up of outputs i and N/2 + i; y16 [R, N/2] gets the same rounded. One group only.
  bool swiglu = false;
  Narrow16 y16;
  // A decode step's conv fused (a Mamba in_proj of one-token rows): outputs [0, Di) are the conv's inputs u, which
  // go through the conv instead of into y. One group only.
  DecodeConv conv;
};

// Weights of this type in one 16-byte load: K must be a multiple of it.
int64_t skinny_weights_per_load(DType dtype);

// Whether the kernel takes these operands: 16-byte aligned weights and x rows, K a multiple of one load, x16
// only beside 16-bit weights, group_ids only beside group_rows (without them, one group), swiglu only for one group of
// up to 2 rows with N even, and conv only for one group of up to 2 rows without swiglu.
bool skinny_gemm_applies(const SkinnyGemm& params);

// y[i] = x[i] · w_gᵀ for every row i of every group g.
void skinny_gemm(const SkinnyGemm& params, cudaStream_t stream);

}  // namespace jambo::backend::cuda
