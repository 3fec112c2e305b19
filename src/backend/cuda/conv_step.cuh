// The causal conv's per-(token, channel) arithmetic, shared by the conv kernel (mamba.cu) and the in_proj
// GEMM that runs a decode step's conv as it finishes each input u (DecodeConv, skinny_gemm.cu): one conv_output, so
// that both give the same bits. Included by .cu files only.
#pragma once

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mamba.h"

namespace jambo::backend::cuda {

// The conv tail of channel c in the slot at slot_offset: [K-1], oldest input first.
__device__ inline StateValues tail_at(int64_t slot_offset, const MambaStateLayout& layout, StateValues state_pool,
                                      int64_t c) {
  return state_pool + (slot_offset + layout.layer_offset + device_offset(c, layout.kernel_size - 1));
}

// Row r's conv tail of channel c in its slot.
__device__ inline StateValues slot_tail(const DeviceRows& rows, const MambaStateLayout& layout, StateValues state_pool,
                                        int64_t r, int64_t c) {
  return tail_at(rows.state_offset[r], layout, state_pool, c);
}

// Checkpoint k's conv tail of channel c (DeviceRows::checkpoint_offset).
__device__ inline StateValues checkpoint_tail(const DeviceRows& rows, const MambaStateLayout& layout,
                                              StateValues state_pool, int64_t k, int64_t c) {
  return tail_at(rows.checkpoint_offset[k], layout, state_pool, c);
}

// silu(bias + sum_k tap(k) * input(k)) over the window's K entries, summed in tap order as the CPU twin sums it,
// each tap one fused multiply-add (device_math.cuh: pinned, as two kernels inline it).
template <typename Tap, typename Input>
__device__ inline float conv_output(int kernel_size, float bias, const Tap& tap, const Input& input) {
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxConvTaps; ++k)
    if (k < kernel_size) sum = __fmaf_rn(tap(k), input(k), sum);
  return silu(__fadd_rn(sum, bias));
}

// DecodeConv's operands of one channel, one per lane of the warp that computes the channel's input u: loaded before
// the GEMM streams its weights (they are no earlier kernel's output in this step), so that its end waits on no
// load. Lane kRowLanes * m + k holds entry k of row m's tail (0 for a row without state, law 1), lane kTapLane + k
// tap k, lane kBiasLane the bias.
struct ConvOperandLanes {
  static constexpr int kRowLanes = 8, kMaxRows = 2, kTapLane = 16, kBiasLane = 24;
  static_assert(kMaxConvTaps - 1 <= kRowLanes && kRowLanes * kMaxRows <= kTapLane &&
                    kTapLane + kMaxConvTaps <= kBiasLane && kBiasLane < kWarpSize,
                "one warp's lanes hold a channel's tails, taps and bias");

  // Rows first_row .. first_row + num_rows - 1 (tokens of their rows alone), channel c; lane < 32.
  __device__ static float load(const DecodeConv& conv, int64_t first_row, int num_rows, int64_t c, int lane) {
    const int kernel_size = int(conv.layout.kernel_size), tail_size = kernel_size - 1;
    const int m = lane / kRowLanes, k = lane % kRowLanes;
    if (lane < kTapLane) {
      if (m >= num_rows || k >= tail_size || conv.rows.reads_state[first_row + m] == 0) return 0.0f;
      return slot_tail(conv.rows, conv.layout, conv.state_pool, first_row + m, c).get(k);
    }
    if (lane < kTapLane + kernel_size) return conv.weight[device_offset(c, kernel_size) + lane - kTapLane];
    return lane == kBiasLane && conv.bias != nullptr ? conv.bias[c] : 0.0f;
  }

  // The conv of channel c of row first_row + m given its input u: every lane of the warp calls it with its operand
  // (the window and taps meet by shuffles). The writing warp's lane 0 stores the output and its 16-bit copy, and its
  // lanes below K-1 the new tail.
  __device__ static void finish(const DecodeConv& conv, int64_t first_row, int m, int64_t c, float u, float operand,
                                int lane, bool writing_warp) {
    const int kernel_size = int(conv.layout.kernel_size), tail_size = kernel_size - 1;
    const auto tail_entry = [&](int k) { return __shfl_sync(0xffffffffu, operand, kRowLanes * m + k); };
    const auto tap = [&](int k) { return __shfl_sync(0xffffffffu, operand, kTapLane + k); };
    const auto window = [&](int k) { return k < tail_size ? tail_entry(k) : u; };  // k the same in every lane
    const float output = conv_output(kernel_size, __shfl_sync(0xffffffffu, operand, kBiasLane), tap, window);
    const float next = __shfl_sync(0xffffffffu, operand, (kRowLanes * m + lane + 1) % kWarpSize);  // tail entry lane+1
    if (!writing_warp) return;
    const int64_t t = first_row + m, i = device_offset(t, conv.layout.num_channels) + c;
    if (lane == 0) {
      conv.activated[i] = output;
      if (conv.activated16.present()) store_narrow(conv.activated16, i, output);
    }
    if (lane < tail_size)
      slot_tail(conv.rows, conv.layout, conv.state_pool, t, c).set(lane, lane + 1 < tail_size ? next : u);
  }
};

}  // namespace jambo::backend::cuda
