#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mamba_kernels.h"

namespace jambo::cuda {
namespace {

constexpr int kThreads = 256;

// Entry `index` of a row's conv window: the tail (K-1 entries, zeros without state), then the row's inputs.
__device__ inline float window_at(int64_t index, int64_t tail_size, bool reads_state,
                                  const float* tail,     // [K-1] this channel's tail in the slot
                                  const float* u_first,  // the row's first input u of this channel
                                  int64_t u_stride) {    // 2*Di
  if (index >= tail_size) return u_first[device_offset(index - tail_size, u_stride)];
  return reads_state ? tail[index] : 0.0f;
}

__global__ void conv_outputs_kernel(DeviceRows rows, MambaStateLayout layout,
                                    const float* projected,    // [T, 2*Di]
                                    const float* conv_weight,  // [Di, K]
                                    const float* conv_bias,    // [Di] or null
                                    const float* state_pool,   // [num_slots, elements_per_slot]
                                    float* activated) {        // [T, Di]
  const int64_t num_channels = layout.num_channels;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(rows.num_tokens, num_channels)) return;
  const int64_t t = i / num_channels, c = i % num_channels;
  const int64_t r = rows.token_row[t];
  const int64_t first = rows.first_token[r];
  const int64_t tail_size = layout.kernel_size - 1;
  const float* tail = state_pool + rows.state_offset[r] + layout.layer_offset + device_offset(c, tail_size);
  const int64_t u_stride = 2 * num_channels;
  const float* u_first = projected + device_offset(first, u_stride) + c;
  const bool reads_state = rows.reads_state[r] != 0;
  const int64_t index = t - first;
  float sum = 0.0f;
  for (int64_t j = 0; j < layout.kernel_size; ++j)
    sum += conv_weight[device_offset(c, layout.kernel_size) + j] *
           window_at(index + j, tail_size, reads_state, tail, u_first, u_stride);
  activated[i] = silu(sum + (conv_bias == nullptr ? 0.0f : conv_bias[c]));
}

// After every output has read the old tails: each (row, channel) keeps the last K-1 window entries. In place:
// entry j reads window index num_tokens + j > j, which is not yet overwritten.
__global__ void conv_tail_kernel(DeviceRows rows, MambaStateLayout layout,
                                 const float* projected,  // [T, 2*Di]
                                 float* state_pool) {     // [num_slots, elements_per_slot]
  const int64_t num_channels = layout.num_channels;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(rows.num_rows, num_channels)) return;
  const int64_t r = i / num_channels, c = i % num_channels;
  const int64_t tail_size = layout.kernel_size - 1;
  float* tail = state_pool + rows.state_offset[r] + layout.layer_offset + device_offset(c, tail_size);
  const int64_t u_stride = 2 * num_channels;
  const float* u_first = projected + device_offset(rows.first_token[r], u_stride) + c;
  const bool reads_state = rows.reads_state[r] != 0;
  const int64_t num_tokens = rows.row_tokens[r];
  for (int64_t j = 0; j < tail_size; ++j)
    tail[j] = window_at(num_tokens + j, tail_size, reads_state, tail, u_first, u_stride);
}

// The selective scan's operands, one struct for its two kernels (the multi-token scan and the one-token update).
struct ScanParams {
  DeviceRows rows;
  MambaStateLayout layout;
  const float* activated;  // [T, Di] u after the conv and SiLU
  const float* delta_raw;  // [T, Di] dt_proj output before its bias
  const float* dt_bias;    // [Di]
  const float* selective;  // [T, selective_stride] the normalized B at column b_column, C after it
  int64_t selective_stride, b_column;
  const float* projected;  // [T, 2*Di]; columns Di..2Di-1 are z
  const float* a;          // [Di, N] A = -exp(A_log)
  const float* d;          // [Di]
  float* state_pool;       // [num_slots, elements_per_slot]
  float* gated;            // [T, Di]
};

// Lanes of a group of `group_size` (a power of two dividing 32) hold one state entry each. Rows of one token
// are left to selective_state_update_kernel.
__global__ void selective_scan_kernel(const ScanParams p, int group_size) {
  const DeviceRows& rows = p.rows;
  const MambaStateLayout& layout = p.layout;
  const int64_t num_channels = layout.num_channels, state_size = layout.state_size;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t group = thread / group_size;
  const int lane = int(thread % group_size);
  // Whole warps stay in the loop below (the shuffles need them); groups past the end compute nothing.
  const bool in_range = group < device_offset(rows.num_rows, num_channels);
  const int64_t r = in_range ? group / num_channels : 0, c = in_range ? group % num_channels : 0;
  const bool active = in_range && rows.row_tokens[r] > 1;
  const bool owns_entry = active && lane < state_size;
  float* saved_h = p.state_pool + rows.state_offset[r] + layout.layer_offset +
                   device_offset(num_channels, layout.kernel_size - 1) + device_offset(c, state_size) + lane;
  const float a_n = owns_entry ? p.a[device_offset(c, state_size) + lane] : 0.0f;
  float h = owns_entry && rows.reads_state[r] != 0 ? *saved_h : 0.0f;
  const float skip = p.d[c], bias = p.dt_bias[c];
  const int64_t first = rows.first_token[r];
  const int64_t num_tokens = active ? rows.row_tokens[r] : 0;
  // Every group of a warp must run the same number of shuffles: loop to the warp's longest row.
  int64_t warp_tokens = num_tokens;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    warp_tokens = max(warp_tokens, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)warp_tokens, offset));
  for (int64_t i = 0; i < warp_tokens; ++i) {
    const bool live = i < num_tokens;
    const int64_t t = first + (live ? i : 0);
    float contribution = 0.0f;
    float u = 0.0f;
    if (live) {
      const float step = softplus(p.delta_raw[device_offset(t, num_channels) + c] + bias);
      u = p.activated[device_offset(t, num_channels) + c];
      if (owns_entry) {
        const float* b = p.selective + device_offset(t, p.selective_stride) + p.b_column;
        h = expf(step * a_n) * h + step * b[lane] * u;
        contribution = h * b[state_size + lane];
      }
    }
    for (int offset = group_size / 2; offset > 0; offset /= 2)
      contribution += __shfl_xor_sync(0xffffffffu, contribution, offset, group_size);
    if (live && lane == 0) {
      const float z = p.projected[device_offset(t, 2 * num_channels) + num_channels + c];
      p.gated[device_offset(t, num_channels) + c] = (contribution + skip * u) * silu(z);
    }
  }
  if (owns_entry) *saved_h = h;
}

constexpr int kMaxStateSize = kWarpSize;

// dst[0..count) = src[0..count): as float4 loads where src allows, so that a thread's whole state is in flight
// at once and each load instruction of a warp fills whole sectors by halves.
__device__ inline void load_entries(const float* src, int count, float (&dst)[kMaxStateSize]) {
  const bool vector = count % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
#pragma unroll
  for (int q = 0; q < kMaxStateSize / 4; ++q) {
    if (4 * q >= count) continue;
    if (vector) {
      const float4 v = reinterpret_cast<const float4*>(src)[q];
      dst[4 * q] = v.x, dst[4 * q + 1] = v.y, dst[4 * q + 2] = v.z, dst[4 * q + 3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * q + j < count) dst[4 * q + j] = src[4 * q + j];
    }
  }
}

__device__ inline void store_entries(const float (&src)[kMaxStateSize], int count, float* dst) {
  const bool vector = count % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
#pragma unroll
  for (int q = 0; q < kMaxStateSize / 4; ++q) {
    if (4 * q >= count) continue;
    if (vector) {
      reinterpret_cast<float4*>(dst)[q] = make_float4(src[4 * q], src[4 * q + 1], src[4 * q + 2], src[4 * q + 3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (4 * q + j < count) dst[4 * q + j] = src[4 * q + j];
    }
  }
}

// The scan of the rows of one token (decode): one thread per (row, channel) updates the channel's state in
// place in the slot. The state, A, B and C are all loaded before any entry is computed (a loop of load, update,
// store per entry waited on memory once per entry: 6 ms of a 13 ms step at batch 256). Longer rows are the
// scan kernel's.
__global__ void selective_state_update_kernel(const ScanParams p) {
  const DeviceRows& rows = p.rows;
  const MambaStateLayout& layout = p.layout;
  const int64_t num_channels = layout.num_channels;
  const int state_size = int(layout.state_size);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(rows.num_rows, num_channels)) return;
  const int64_t r = i / num_channels, c = i % num_channels;
  if (rows.row_tokens[r] != 1) return;
  const int64_t t = rows.first_token[r];
  float* saved_h = p.state_pool + rows.state_offset[r] + layout.layer_offset +
                   device_offset(num_channels, layout.kernel_size - 1) + device_offset(c, state_size);
  float h[kMaxStateSize], a[kMaxStateSize], b[kMaxStateSize], c_out[kMaxStateSize];
  const float* bc = p.selective + device_offset(t, p.selective_stride) + p.b_column;  // B [N], then C [N]
  load_entries(p.a + device_offset(c, state_size), state_size, a);
  load_entries(bc, state_size, b);
  load_entries(bc + state_size, state_size, c_out);
  if (rows.reads_state[r] != 0) {
    load_entries(saved_h, state_size, h);
  } else {  // law 1: a row without state starts from zero
#pragma unroll
    for (int n = 0; n < kMaxStateSize; ++n) h[n] = 0.0f;
  }
  const float step = softplus(p.delta_raw[device_offset(t, num_channels) + c] + p.dt_bias[c]);
  const float u = p.activated[device_offset(t, num_channels) + c];
  float y = 0.0f;
#pragma unroll
  for (int n = 0; n < kMaxStateSize; ++n) {
    if (n >= state_size) continue;
    h[n] = expf(step * a[n]) * h[n] + step * b[n] * u;
    y += h[n] * c_out[n];
  }
  store_entries(h, state_size, saved_h);
  const float z = p.projected[device_offset(t, 2 * num_channels) + num_channels + c];
  p.gated[device_offset(t, num_channels) + c] = (y + p.d[c] * u) * silu(z);
}

}  // namespace

void causal_conv1d(const DeviceRows& rows, const MambaStateLayout& layout, const float* projected,
                   const float* conv_weight, const float* conv_bias, float* state_pool, float* activated,
                   cudaStream_t stream) {
  const int64_t num_outputs = device_offset(rows.num_tokens, layout.num_channels);
  if (num_outputs == 0) return;
  conv_outputs_kernel<<<num_blocks_for(num_outputs, kThreads), kThreads, 0, stream>>>(
      rows, layout, projected, conv_weight, conv_bias, state_pool, activated);
  JAMBO_CUDA_CHECK_LAUNCH(conv_outputs_kernel);
  const int64_t num_tails = device_offset(rows.num_rows, layout.num_channels);
  conv_tail_kernel<<<num_blocks_for(num_tails, kThreads), kThreads, 0, stream>>>(rows, layout, projected, state_pool);
  JAMBO_CUDA_CHECK_LAUNCH(conv_tail_kernel);
}

void selective_scan(const DeviceRows& rows, const MambaStateLayout& layout, const float* activated,
                    const float* delta_raw, const float* dt_bias, const float* selective, int64_t selective_stride,
                    int64_t b_column, const float* projected, const float* a, const float* d, float* state_pool,
                    float* gated, cudaStream_t stream) {
  require(layout.state_size >= 1 && layout.state_size <= kMaxStateSize,
          "the CUDA selective scan supports mamba_d_state up to 32, got " + std::to_string(layout.state_size));
  const ScanParams params{rows,      layout,   activated, delta_raw, dt_bias, selective, selective_stride,
                          b_column,  projected, a,         d,         state_pool, gated};
  const int64_t num_decode_threads = device_offset(rows.num_rows, layout.num_channels);
  if (num_decode_threads == 0) return;
  selective_state_update_kernel<<<num_blocks_for(num_decode_threads, kThreads), kThreads, 0, stream>>>(params);
  JAMBO_CUDA_CHECK_LAUNCH(selective_state_update_kernel);
  if (rows.num_tokens == rows.num_rows) return;  // every row one token: a decode step
  int group_size = 1;
  while (group_size < layout.state_size) group_size *= 2;
  const int64_t num_threads = device_offset(num_decode_threads, group_size);
  selective_scan_kernel<<<num_blocks_for(num_threads, kThreads), kThreads, 0, stream>>>(params, group_size);
  JAMBO_CUDA_CHECK_LAUNCH(selective_scan_kernel);
}

}  // namespace jambo::cuda
