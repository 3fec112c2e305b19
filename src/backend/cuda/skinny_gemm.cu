#include "backend/cuda/conv_step.cuh"
#include "backend/cuda/skinny_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jambo::backend::cuda {
namespace {

// A block holds kOutputsPerBlock outputs of kWarpsPerOutput warps each. A dense GEMM of one or two rows takes two
// outputs a block (a warp each), or one of four warps when it has few outputs (kWarpsPerWideOutput); a grouped GEMM
// takes four outputs a block. Two rather than four for the dense launches: the block scheduler spreads the work finer,
// and a GEMV's end overlaps the next one's start better (H200, 3B shape, batch 1: 422-425 -> 432-435 tok/s; a plain
// GEMV of the four layer shapes in a chain: 62.9 us with 4-warp blocks, 58.9 with 2, 63.2 with 1, 64.3 with 8). Four
// for the groups: when their grid still spanned every expert (most without rows at batch 1), two doubled those blocks
// (Jamba-v0.1, batch 1: 101.4 -> 84.2 tok/s); two with group_ids is not measured.
constexpr int kDenseOutputsPerBlock = 2;
constexpr int kGroupOutputsPerBlock = 4;
constexpr int kWarpsPerWideOutput = 4;

// What the kernel does with an output's sum: stores it into y, or pairs gates with ups (SkinnyGemm::swiglu), or
// runs the conv of the inputs u among them (SkinnyGemm::conv).
enum class Epilogue { kStore, kSwiGlu, kConv };

// What one 16-byte load of weights holds, widened, and x rounded to the weights' type: Weight is float (kept as
// it is) or a 16-bit type (__nv_bfloat16, __half), whose conversions from float round to nearest even.
template <typename Weight>
struct WeightLoad {
  static constexpr int kCount = 16 / sizeof(Weight);
  __device__ static void widen(const uint4& bits, float* out) {
    const auto* values = reinterpret_cast<const Weight*>(&bits);
#pragma unroll
    for (int j = 0; j < kCount; ++j) out[j] = float(values[j]);
  }
  __device__ static float round(float value) { return float(Weight(value)); }
};

// sum + (((x0 w0 + x1 w1) + x2 w2) + x3 w3), pinned (device_math.cuh): every instantiation of the kernel (x as fp32
// or as its 16-bit copy, one to kSkinnyRows rows a pass, each epilogue) adds a row's products in this one way.
__device__ inline float add_four_products(float sum, float x0, float w0, float x1, float w1, float x2, float w2,
                                          float x3, float w3) {
  return __fadd_rn(sum, __fmaf_rn(x3, w3, __fmaf_rn(x2, w2, __fmaf_rn(x1, w1, __fmul_rn(x0, w0)))));
}

// Adds x[m, k .. k + kCount) · widened to sums[m] for the pass's rows m: x read as fp32 and rounded to the
// weights' type, or (kNarrowX) read as its producer's 16-bit copy of that type, half the bytes. Both add four
// products at a time (add_four_products), so that the two give the same sums bit for bit; and neither holds a row's
// x in registers (with eight rows of x per pass that doubled the registers, and halved the occupancy).
// x is read with plain loads, never through the read-only path (__ldg, ld.global.nc): the kernel starts early,
// while the kernel that writes x may still run, and a read-only load may be served stale or issued before the wait
// (it was: 3B-shape decode steps in the bf16 mode read wrong inputs now and then; Bf16DecodeTest).
template <typename Weight, int kRows, bool kNarrowX>
__device__ inline void accumulate(const SkinnyGemm& p, int64_t first_row, int num_rows, int64_t k, const uint4& packed,
                                  float (&sums)[kRows]) {
  using Load = WeightLoad<Weight>;
  float w[Load::kCount];
  Load::widen(packed, w);
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    if (m >= num_rows) continue;
    if constexpr (kNarrowX) {
      float x[Load::kCount];
      const uint4 packed_x = *reinterpret_cast<const uint4*>(p.x16 + device_offset(first_row + m, p.k) + k);
      Load::widen(packed_x, x);
#pragma unroll
      for (int q = 0; q < Load::kCount; q += 4)
        sums[m] = add_four_products(sums[m], x[q], w[q], x[q + 1], w[q + 1], x[q + 2], w[q + 2], x[q + 3], w[q + 3]);
    } else {
      const float4* chunk = reinterpret_cast<const float4*>(p.x + device_offset(first_row + m, p.x_stride) + k);
#pragma unroll
      for (int q = 0; q < Load::kCount; q += 4) {
        const float4 v = chunk[q / 4];
        sums[m] = add_four_products(sums[m], Load::round(v.x), w[q], Load::round(v.y), w[q + 1], Load::round(v.z),
                                    w[q + 2], Load::round(v.w), w[q + 3]);
      }
    }
  }
}

// The sum over an output's kWarpsPerOutput warps (all of the block's when more than one), for its first lane.
template <int kWarpsPerOutput>
__device__ inline float output_sum(float value) {
  value = warp_sum(value);
  if constexpr (kWarpsPerOutput == 1) {
    return value;
  } else {
    __shared__ float partial[kWarpsPerOutput];  // the block is the output's warps
    if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize] = value;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsPerOutput; ++w) total += partial[w];
    __syncthreads();  // partial is rewritten by the next row of x
    return total;
  }
}

// SwiGLU's epilogue (SkinnyGemm::swiglu): warp 0 holds the gate of output i, warp 1 its up; the up meets the gate
// in shared memory. The same arithmetic as the SwiGLU kernel (swiglu_value).
template <int kRows>
__device__ inline void store_swiglu(const SkinnyGemm& p, int64_t first_row, int num_rows, int64_t i, int lane,
                                    const float (&sums)[kRows]) {
  __shared__ float ups[kRows];
  const bool holds_gate = threadIdx.x < kWarpSize;
  float totals[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    totals[m] = m < num_rows ? warp_sum(sums[m]) : 0.0f;
    if (!holds_gate && lane == 0) ups[m] = totals[m];
  }
  __syncthreads();
  const int64_t half = p.n / 2;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    if (m >= num_rows || !holds_gate || lane != 0) continue;
    const float value = swiglu_value(totals[m], ups[m]);
    const int64_t at = device_offset(first_row + m, half) + i;
    if (p.y != nullptr) p.y[at] = value;
    if (p.y16.present()) store_narrow(p.y16, at, value);
  }
  __syncthreads();  // ups is rewritten by the next pass
}

// kWarpsPerOutput warps per (output n, group); the block's warps take consecutive outputs (with kSwiGlu: warp 0 the
// gate of the block's output i, warp 1 its up). Passes of kRows rows of x; each lane has kLoadsInFlight 16-byte
// loads in flight, the last batch of a row predicated rather than issued one by one (a row of 2560 bf16 weights is
// 10 loads per lane: batches of 4, 4 and 2, not 4, 4, 1 and 1). A GEMM of few outputs (x_proj: 192) takes four warps
// per output, so that it has blocks for every SM and fewer loads per lane; their sums meet in shared memory, in warp
// order (H200, ncu: the 3B shape's x_proj at batch 1 took 7.3 us with a warp per output, 5.4 with four).
// Launched to start early (device_math.cuh): the weights are no kernel's output, so the first batch of them is in
// flight before the wait for the previous kernel, whose end then overlaps this one's start. Groups wait first:
// their row counts are the previous kernel's output.
template <typename Weight, int kRows, int kLoadsInFlight, bool kNarrowX, int kWarpsPerOutput, int kOutputsPerBlock,
          Epilogue kEpilogue = Epilogue::kStore>
__global__ void __launch_bounds__(kWarpsPerOutput* kOutputsPerBlock* kWarpSize) skinny_gemm_kernel(const SkinnyGemm p) {
  constexpr int kLanes = kWarpsPerOutput * kWarpSize;  // along one output's row of weights
  constexpr bool kSwiGlu = kEpilogue == Epilogue::kSwiGlu;
  static_assert(!kSwiGlu || (kWarpsPerOutput == 1 && kOutputsPerBlock == 2), "SwiGLU pairs a gate with its up");
  static_assert(kWarpsPerOutput == 1 || kOutputsPerBlock == 1, "an output of several warps takes the block");
  static_assert(kEpilogue != Epilogue::kConv || kRows <= ConvOperandLanes::kMaxRows, "the conv takes one pass");
  let_next_kernel_start();
  bool waited = p.group_rows != nullptr;
  if (waited) wait_for_previous_kernel();
  using Load = WeightLoad<Weight>;
  const int group = p.group_ids == nullptr ? int(blockIdx.y) : p.group_ids[blockIdx.y];
  if (group < 0) return;  // a launch row beyond the groups with rows
  const int64_t first = p.group_rows == nullptr ? 0 : p.group_rows[group];
  const int64_t count = p.group_rows == nullptr ? p.num_rows : p.group_rows[group + 1] - first;
  const int warp = int(threadIdx.x) / kLanes;
  const int64_t pair = blockIdx.x;  // kSwiGlu: the output i of silu(gate) * up
  const int64_t n = kSwiGlu ? pair + warp * (p.n / 2) : int64_t(blockIdx.x) * kOutputsPerBlock + warp;
  if (count == 0 || n >= p.n) return;  // the same for all warps of an output (of the block, with kSwiGlu)
  const int lane = threadIdx.x % kLanes;
  // The same for all warps of an output.
  const bool runs_conv = kEpilogue == Epilogue::kConv && n < p.conv.layout.num_channels;
  const float conv_operand =
      runs_conv ? ConvOperandLanes::load(p.conv, first, int(count), n, int(threadIdx.x) % kWarpSize) : 0.0f;
  const void* weight = p.weights == nullptr ? p.weight : p.weights[group];
  const uint4* w_row = reinterpret_cast<const uint4*>(static_cast<const Weight*>(weight) + device_offset(n, p.k));
  const int64_t num_loads = p.k / Load::kCount;  // 16-byte loads along the row
  for (int64_t row0 = 0; row0 < count; row0 += kRows) {
    const int num_rows = int(min(int64_t(kRows), count - row0));
    float sums[kRows] = {};
    // Whole batches, then the row's rest as one predicated batch.
    const auto batch = [&](int64_t load, bool whole) {
      uint4 packed[kLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u)  // streamed once
        packed[u] = whole || load + u * kLanes < num_loads ? __ldcs(w_row + load + u * kLanes) : uint4{};
      if (!waited) wait_for_previous_kernel(), waited = true;
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u)
        if (whole || load + u * kLanes < num_loads)
          accumulate<Weight, kRows, kNarrowX>(p, first + row0, num_rows, (load + u * kLanes) * Load::kCount, packed[u],
                                              sums);
    };
    int64_t load = lane;
    for (; load + (kLoadsInFlight - 1) * kLanes < num_loads; load += kLoadsInFlight * kLanes) batch(load, true);
    if (load < num_loads) batch(load, false);
    if (!waited) wait_for_previous_kernel(), waited = true;  // a lane past the row's loads, before lane 0 writes
    if constexpr (kSwiGlu) {
      store_swiglu(p, first + row0, num_rows, pair, lane, sums);
    } else {
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        if (m >= num_rows) continue;
        const float total = output_sum<kWarpsPerOutput>(sums[m]);
        if (runs_conv)
          ConvOperandLanes::finish(p.conv, first, m, n, total, conv_operand, int(threadIdx.x) % kWarpSize,
                                   lane < kWarpSize);  // the output's first warp writes
        else if (lane == 0)
          p.y[device_offset(first + row0 + m, p.n) + n] = total;
      }
    }
  }
}

// 16-byte loads per lane in flight in a dense launch. Four rather than eight: fewer registers, more resident warps,
// and a row's loads in even batches (H200, bf16, one row, each 3B shape 8 times over in a CUDA graph, us per GEMM
// with 2 / 3 / 4 / 5 / 6 / 8 loads: in_proj 16.2 / 15.9 / 14.9 / 15.9 / 15.3 / 16.0, out_proj 11.7 / 10.6 / 8.8 /
// 10.7 / 10.7 / 10.2, gate_up 23.4 / 23.8 / 22.3 / 22.5 / 21.7 / 23.7, down 17.7 / 16.6 / 13.2 / 16.8 / 16.4 / 16.2).
constexpr int kDenseLoadsInFlight = 4;

// One group (a dense GEMM) of one or two rows: the one-pass launches, the only ones with an epilogue.
bool dense_of_few_rows(const SkinnyGemm& p) { return p.group_rows == nullptr && p.num_rows <= kMaxSkinnyGemmRows; }

// A dense GEMM of one or two rows: one pass, kDenseLoadsInFlight deep, x read as its 16-bit copy where there is one.
template <typename Weight, int kWarpsPerOutput, Epilogue kEpilogue>
void launch_dense(const SkinnyGemm& p, cudaStream_t stream) {
  constexpr int kOutputs = kWarpsPerOutput == 1 ? kDenseOutputsPerBlock : 1;      // per block
  const unsigned num_blocks = kEpilogue == Epilogue::kSwiGlu ? unsigned(p.n / 2)  // a gate and its up a block
                                                             : num_blocks_for(p.n, kOutputs);
  const dim3 grid(num_blocks), block(kWarpsPerOutput * kOutputs * kWarpSize);
  constexpr int kRows = int(kMaxSkinnyGemmRows);
  if (p.x16 != nullptr)
    launch_early(skinny_gemm_kernel<Weight, kRows, kDenseLoadsInFlight, true, kWarpsPerOutput, kOutputs, kEpilogue>,
                 grid, block, 0, stream, p);
  else
    launch_early(skinny_gemm_kernel<Weight, kRows, kDenseLoadsInFlight, false, kWarpsPerOutput, kOutputs, kEpilogue>,
                 grid, block, 0, stream, p);
}

// A dense GEMM of one or two rows with the given epilogue; below kMinOutputsOfOneWarp outputs, kWarpsPerWideOutput
// warps per output, except with SwiGLU (an MLP's thousands of outputs).
template <typename Weight, Epilogue kEpilogue>
void launch_dense(const SkinnyGemm& p, cudaStream_t stream) {
  if constexpr (kEpilogue == Epilogue::kSwiGlu)
    launch_dense<Weight, 1, kEpilogue>(p, stream);
  else if (p.n < kMinOutputsOfOneWarp)
    launch_dense<Weight, kWarpsPerWideOutput, kEpilogue>(p, stream);
  else
    launch_dense<Weight, 1, kEpilogue>(p, stream);
}

// 16-byte loads per lane in flight in the other launches (groups, and dense GEMMs of more than two rows).
constexpr int kGroupLoadsInFlight = 4;

// Dense GEMMs of one or two rows; groups (experts) and more rows: passes of kSkinnyRows, a warp per output.
template <typename Weight>
void launch(const SkinnyGemm& p, cudaStream_t stream) {
  if (p.swiglu) return launch_dense<Weight, Epilogue::kSwiGlu>(p, stream);
  if (p.conv.present()) return launch_dense<Weight, Epilogue::kConv>(p, stream);
  if (dense_of_few_rows(p)) return launch_dense<Weight, Epilogue::kStore>(p, stream);
  const dim3 grid(num_blocks_for(p.n, kGroupOutputsPerBlock), unsigned(p.num_groups));
  const dim3 block(kGroupOutputsPerBlock * kWarpSize);
  launch_early(skinny_gemm_kernel<Weight, kSkinnyRows, kGroupLoadsInFlight, false, 1, kGroupOutputsPerBlock>, grid,
               block, 0, stream, p);
}

}  // namespace

int64_t skinny_weights_per_load(DType dtype) { return 16 / dtype_size(dtype); }

bool skinny_gemm_applies(const SkinnyGemm& p) {
  const int64_t per_load = skinny_weights_per_load(p.dtype);
  // Group weights are 16-byte aligned when K is a multiple of a load: each expert's matrix starts a whole number of
  // [N, K] matrices into a cudaMalloc'd buffer.
  const bool weight_aligned = p.weights != nullptr || reinterpret_cast<uintptr_t>(p.weight) % 16 == 0;
  const bool x16_fits = p.x16 == nullptr || (p.dtype != DType::F32 && reinterpret_cast<uintptr_t>(p.x16) % 16 == 0);
  const bool swiglu_fits = !p.swiglu || (dense_of_few_rows(p) && p.n % 2 == 0);
  const bool conv_fits = !p.conv.present() || (dense_of_few_rows(p) && !p.swiglu);
  const bool groups_fit = p.group_rows != nullptr || (p.num_groups == 1 && p.group_ids == nullptr);
  return p.k % per_load == 0 && p.x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && weight_aligned &&
         x16_fits && swiglu_fits && conv_fits && groups_fit;
}

void skinny_gemm(const SkinnyGemm& p, cudaStream_t stream) {
  require(skinny_gemm_applies(p), "skinny_gemm called on operands it does not take (please report this)");
  require(p.num_groups > 0 && p.num_groups < 65536,
          "a skinny GEMM takes 1 to 65535 groups, got " + std::to_string(p.num_groups));
  // Without rows no block would wait for the kernel before it, and this one's end would no longer imply that one's.
  require(p.group_rows != nullptr || p.num_rows > 0, "a dense skinny GEMM needs rows (please report this)");
  if (p.dtype == DType::F32)
    launch<float>(p, stream);
  else if (p.dtype == DType::BF16)
    launch<__nv_bfloat16>(p, stream);
  else
    launch<__half>(p, stream);
}

}  // namespace jambo::backend::cuda
