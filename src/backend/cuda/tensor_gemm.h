// The invariant GEMM, in one summation order for every number of rows: y = x · wᵀ with w [N, K] in nn.Linear layout,
// fp32 accumulation and output. 16-bit weights (bf16, f16) run on the tensor cores with x [rows, K] rounded to w's
// type; fp32 weights on the FMA units with x as it is. A row's outputs are therefore the same bits whether it runs
// alone, among 255 others, first or last (docs/DESIGN.md: GPU invariance). cuBLAS cannot promise that: it picks
// tiles and split-K by the number of rows.
//
// The order (GemmOrder): K is cut into k-steps of 16, the operand depth of the m16n8k16 mma instruction (a K that is
// not a multiple of 16 ends in a step padded with zeros; for fp32 weights a k-step is 16 fused multiply-adds in
// increasing k, x · w + sum, from the first k of the step), and the k-steps into slices. A slice is summed from zero,
// k-step after k-step in increasing order, by mma alone; y = ((0 + slice 0) + slice 1) + ... in slice order. The
// slices follow N and K alone. They exist for the rows of a decode step: a GEMM of one row has only N / 16 pieces of
// 16 output rows to spread over the GPU, too few to stream the weights at full bandwidth, so where a launch has few
// tiles each slice of each tile becomes a block of its own, and the block that finishes a tile's last slice adds the
// slices' partial sums in slice order. A launch of tiles enough has one block walk all of K for its tile and add each
// slice's sum to a running total as the slice ends. The instruction's own sum of a k-step does not depend on where in
// the tile the row or the output sits (tests/backend/cuda/tensor_core_probe_test.cpp), so the tile a row count takes
// (by speed alone) and either launch give the same bits. A block's first stages of weights are copied before it waits
// for the kernel ahead (device_math.cuh): the weights are no kernel's output.
#pragma once

#include "backend/cuda/device_memory.h"
#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace jambo::backend::cuda {

// How the sum over K of a [N, K] weight is ordered: num_slices slices of slice_steps k-steps of 16 (the last may be
// shorter).
struct GemmOrder {
  int64_t num_steps = 0;    // ceil(K / 16)
  int64_t slice_steps = 0;  // k-steps per slice
  int64_t num_slices = 0;   // ceil(num_steps / slice_steps)
};

// The order of a [n, k] weight: slices enough for kGemmPiecesWanted (16-row piece, slice) pairs, none shorter than
// kGemmMinSliceSteps k-steps (nor than K).
constexpr int64_t kGemmPiecesWanted = 1024;
constexpr int64_t kGemmMinSliceSteps = 8;
GemmOrder gemm_order(int64_t n, int64_t k);

// Operands whose rows start 16-byte aligned and hold whole 16-byte copies are staged by cp.async, others an element
// at a time: the same arithmetic either way.
struct TensorGemm {
  const void* w = nullptr;     // [n, k] of dtype
  DType dtype = DType::BF16;   // BF16, F16 or F32
  const void* x = nullptr;     // [num_rows, x_stride] of dtype (16-bit: x rounded to it), the first k columns read
  float* y = nullptr;          // [num_rows, n]
  int64_t num_rows = 0, n = 0, k = 0;
  int64_t x_stride = 0;        // elements from one row of x to the next, >= k
};

// What the blocks of a launch with a block per slice share: the partial sums of the slices and, per tile, a count of
// the slices done.
// Sized on first use for a shape (a captured launch must not allocate: the eager step before capture sizes it).
struct TensorGemmScratch {
  DeviceBuffer<float> partials;     // [num_slices, rows, n]
  DeviceBuffer<uint32_t> arrivals;  // [tiles] zero between launches: the last block of a tile sets it back
};

// The tiles a block can compute, named for (outputs of w) x (rows of x): on mma.sync and on wgmma (sm_90a, fed by
// the TMA unit) for 16-bit weights, on the FMA units for fp32 weights.
enum class GemmTile : uint8_t {
  Mma64x8, Mma64x32, Mma64x64, Mma64x64Long, Mma128x64, Mma128x128, Mma128x128Unsliced,
  Wgmma128x64, Wgmma128x128,
  FmaDecode2, FmaDecode8, Fma64x32, Fma64x64, Fma128x128,
};

// A launch: its tile, and whether a block sums one slice of its tile (the slices' sums then meet in the partials,
// added in slice order by the tile's last block) or walks all of K (adding each slice's sum to a running total as it
// ends). Every launch gives the same bits: the choice is speed alone.
struct GemmLaunch {
  GemmTile tile = GemmTile::Mma64x8;
  bool sliced = false;
  bool operator==(const GemmLaunch&) const = default;
};
std::string describe(const GemmLaunch& launch);  // "wgmma 128x64, a block per slice"

// The launches that can run this GEMM here (its weights' type, the GPU, its operands' alignment), and the one
// tensor_gemm takes, chosen by N, K and the rows of x (bench/HISTORY.md has the sweeps behind the rules).
std::vector<GemmLaunch> gemm_launches(const TensorGemm& gemm);
GemmLaunch choose_gemm_launch(const TensorGemm& gemm);

// y = x · wᵀ in gemm_order(n, k), for num_rows >= 1, as choose_gemm_launch lays it out, or as `launch` does (one of
// gemm_launches: the tests and the benchmark try them all).
void tensor_gemm(const TensorGemm& gemm, TensorGemmScratch& scratch, cudaStream_t stream);
void tensor_gemm(const TensorGemm& gemm, const GemmLaunch& launch, TensorGemmScratch& scratch, cudaStream_t stream);

// The rows of x and y in groups, each with its own weight of one shape and type (the MoE experts), their counts on the
// GPU, so that a MoE decode step stays one CUDA graph: a row's outputs are the bits tensor_gemm gives it in a GEMM of
// its group's rows alone. Blocks are laid out for max_group_rows rows in each launch group, and those past a group's
// rows return at once.
struct TensorGemmGroups {
  const int64_t* group_rows = nullptr;   // [G + 1] on the GPU: group g's rows are [group_rows[g], group_rows[g + 1])
  const int32_t* group_ids = nullptr;    // [num_launch_groups] on the GPU: launch group i is group group_ids[i]
                                         //   (none where -1)
  const void* const* weights = nullptr;  // [G] on the GPU: group g's weight [n, k] of the TensorGemm's dtype
  bool weights_aligned = false;          // every weight starts 16-byte aligned (else staged an element at a time)
  int64_t num_launch_groups = 0;
  int64_t max_group_rows = 0;            // no group has more rows
};

// y = x · w_gᵀ for the rows of every group g; gemm.w is not read, gemm.num_rows is every group's rows together.
void tensor_gemm_grouped(const TensorGemm& gemm, const TensorGemmGroups& groups, TensorGemmScratch& scratch,
                         cudaStream_t stream);

}  // namespace jambo::backend::cuda
