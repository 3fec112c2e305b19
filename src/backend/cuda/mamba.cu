#include "backend/cuda/conv_step.cuh"
#include "backend/cuda/mamba.h"

#include <type_traits>

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;

// Entry `index` of a row's conv window: the tail (K-1 entries, zeros without state), then the row's inputs.
__device__ inline float window_at(int64_t index, int64_t tail_size, bool reads_state,
                                  StateValues tail,      // [K-1] this channel's tail in the slot
                                  const float* u_first,  // the row's first input u of this channel
                                  int64_t u_stride) {    // 2*Di
  if (index >= tail_size) return u_first[device_offset(index - tail_size, u_stride)];
  return reads_state ? tail.get(index) : 0.0f;
}

// A block per (kConvThreads channels, kConvTokens consecutive step tokens), a thread per (token, channel). Its
// first threads look up the tokens' rows once, into shared memory. Every thread loads its whole window before it
// stores anything, so that all its loads are in flight at once: the stores may alias them as far as the compiler
// knows (H200, 3B shape, ncu, per layer: batch-256 decode 26 us with a thread per (token, channel) and 64-bit
// index division, 24 with a thread walking 8 tokens and storing each before loading the next, 18.9 now).
// A row of one token (decode) has one thread per channel here, the only reader of the channel's tail: it shifts
// the tail in place after its output, from the window it holds (conv_tail_kernel leaves such rows alone, and a
// decode step skips it).
constexpr int kConvThreads = 128;
constexpr int kConvTokens = 4;

__global__ void __launch_bounds__(kConvThreads* kConvTokens)
    conv_outputs_kernel(DeviceRows rows, MambaStateLayout layout,
                        const float* projected,    // [T, 2*Di]
                        const float* conv_weight,  // [Di, K]
                        const float* conv_bias,    // [Di] or null
                        StateValues state_pool,    // [num_slots, elements_per_slot]
                        float* activated,          // [T, Di]
                        Narrow16 activated16) {    // [T, Di] or absent
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  struct TokenView {
    int64_t index;            // in its row
    const float* u_first;     // the row's first input u of channel 0
    void* tail;               // the row's conv tail of channel 0 in its slot (plain data: no shared initializers)
    bool reads_state, alone;  // alone: the row's only token
  };
  __shared__ TokenView views[kConvTokens];
  const int64_t first_token = int64_t(blockIdx.x) * kConvTokens;
  const int64_t u_stride = 2 * layout.num_channels;
  if (threadIdx.y == 0 && threadIdx.x < kConvTokens && first_token + threadIdx.x < rows.num_tokens) {
    const int64_t t = first_token + threadIdx.x, r = rows.token_row[t], first = rows.first_token[r];
    views[threadIdx.x] = {t - first, projected + device_offset(first, u_stride),
                          slot_tail(rows, layout, state_pool, r, 0).data, rows.reads_state[r] != 0,
                          rows.row_tokens[r] == 1};
  }
  __syncthreads();
  const int num_channels = int(layout.num_channels);
  const int c = int(blockIdx.y) * kConvThreads + threadIdx.x;
  const int64_t t = first_token + threadIdx.y;
  if (c >= num_channels || t >= rows.num_tokens) return;
  const TokenView& view = views[threadIdx.y];
  const int kernel_size = int(layout.kernel_size), tail_size = kernel_size - 1;
  const StateValues tail = StateValues{view.tail, state_pool.dtype} + device_offset(c, tail_size);
  const float* u_first = view.u_first + c;
  const float* weight = conv_weight + device_offset(c, kernel_size);
  float window[kMaxConvTaps];
  const float bias = conv_bias == nullptr ? 0.0f : conv_bias[c];
#pragma unroll
  for (int k = 0; k < kMaxConvTaps; ++k)
    if (k < kernel_size) window[k] = window_at(view.index + k, tail_size, view.reads_state, tail, u_first, u_stride);
  const int64_t i = device_offset(t, num_channels) + c;
  activated[i] = conv_output(
      kernel_size, bias, [&](int k) { return weight[k]; }, [&](int k) { return window[k]; });
  if (activated16.present()) store_narrow(activated16, i, activated[i]);
  if (!view.alone) return;
#pragma unroll
  for (int k = 0; k + 1 < kMaxConvTaps; ++k)
    if (k < tail_size) tail.set(k, window[1 + k]);
}

// After every output has read the old tails: each (row, channel) keeps the last K-1 window entries. In place:
// entry j reads window index num_tokens + j > j, which is not yet overwritten.
__global__ void conv_tail_kernel(DeviceRows rows, MambaStateLayout layout,
                                 const float* projected,    // [T, 2*Di]
                                 StateValues state_pool) {  // [num_slots, elements_per_slot]
  const int64_t num_channels = layout.num_channels;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(rows.num_rows, num_channels)) return;
  const int64_t r = i / num_channels, c = i % num_channels;
  if (rows.row_tokens[r] == 1) return;  // shifted by conv_outputs_kernel
  const int64_t tail_size = layout.kernel_size - 1;
  const StateValues tail = slot_tail(rows, layout, state_pool, r, c);
  const int64_t u_stride = 2 * num_channels;
  const float* u_first = projected + device_offset(rows.first_token[r], u_stride) + c;
  const bool reads_state = rows.reads_state[r] != 0;
  const int64_t num_tokens = rows.row_tokens[r];
  for (int64_t j = 0; j < tail_size; ++j)
    tail.set(j, window_at(num_tokens + j, tail_size, reads_state, tail, u_first, u_stride));
}

// The selective scan's operands, one struct for its kernels (the chunked scan's three and the one-token update).
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
  StateValues state_pool;  // [num_slots, elements_per_slot]
  float* gated;            // [T, Di]
  Narrow16 gated16;        // [T, Di] gated rounded for a 16-bit out_proj, or absent
  float* chunk_end;        // [num_chunks, Di, N] a chunk's last h, from zero state
  float* chunk_start;      // [num_chunks, Di, N] a chunk's h before its first token
  float* delta_sum;        // [num_chunks, Di] the sum of a chunk's deltas
};

// The scan's arithmetic, shared by the chunked scan and the one-token update and pinned (device_math.cuh), so that
// a token advances a state entry to the same bits in both: h = exp(delta * a) * h + delta * b * u.
__device__ inline float ssm_step(float h, float delta, float a, float b, float u) {
  return __fmaf_rn(expf(__fmul_rn(delta, a)), h, __fmul_rn(__fmul_rn(delta, b), u));
}

// y + h * c: one term of the readout h · C.
__device__ inline float readout_add(float y, float h, float c) { return __fmaf_rn(h, c, y); }

// (y + D * u) * silu(z): the token's output from its readout y.
__device__ inline float gated_output(float y, float skip, float u, float z) {
  return __fmul_rn(__fmaf_rn(skip, u, y), silu(z));
}

__device__ inline void store_gated(const ScanParams& p, int64_t i, float value) {
  if (p.gated != nullptr) p.gated[i] = value;
  if (p.gated16.present()) store_narrow(p.gated16, i, value);
}

constexpr int kMaxStateSize = kWarpSize;
constexpr int kScanThreads = 128;  // channels of one chunk per block of the chunk kernels

// One chunk of a row, as a thread of the chunk kernels sees it: its tokens [first, end) and its place in the row.
struct ChunkView {
  int64_t row, first, end;
  bool is_last;
};

__device__ inline ChunkView chunk_view(const DeviceRows& rows, int64_t chunk) {
  ChunkView view;
  view.row = rows.chunk_row[chunk];
  view.first = rows.chunk_first_token[chunk];
  const int64_t row_end = rows.first_token[view.row] + rows.row_tokens[view.row];
  view.end = min(row_end, view.first + kScanChunkTokens);
  view.is_last = view.end == row_end;
  return view;
}

// The SSM state of `row` in its slot, from channel c on: [Di - c, N]. It follows the layer's Di conv tails.
__device__ inline StateValues slot_h(const ScanParams& p, int64_t row, int64_t c) {
  return slot_tail(p.rows, p.layout, p.state_pool, row, p.layout.num_channels) + device_offset(c, p.layout.state_size);
}

// The B and C of a chunk's tokens, which every channel of the chunk reads: [kScanChunkTokens, 2 N] in shared
// memory, staged once per block (a load per entry per block rather than per thread).
struct StagedSelective {
  float values[kScanChunkTokens * 2 * kMaxStateSize];
};

// Stages the B and C of tokens [first, end) into `staged`; every thread of the block calls it.
__device__ void stage_selective(const ScanParams& p, int64_t first, int64_t end, StagedSelective& staged) {
  const int width = 2 * int(p.layout.state_size), count = int(end - first) * width;
  for (int i = threadIdx.x; i < count; i += blockDim.x)
    staged.values[i] = p.selective[device_offset(first + i / width, p.selective_stride) + p.b_column + i % width];
  __syncthreads();
}

// h <- the scan of tokens [first, end) of channel c from h, B and C read from `staged`; returns the sum of their
// deltas. With outputs, each token's gated output is written too.
template <int kStateSize, bool kOutputs>
__device__ float scan_tokens(const ScanParams& p, int64_t c, int64_t first, int64_t end, const StagedSelective& staged,
                             float (&h)[kMaxStateSize]) {
  const int64_t num_channels = p.layout.num_channels;
  const int state_size = kStateSize > 0 ? kStateSize : int(p.layout.state_size);
  float a[kMaxStateSize];
#pragma unroll
  for (int n = 0; n < kMaxStateSize; ++n)
    if (n < state_size) a[n] = p.a[device_offset(c, state_size) + n];
  const float bias = p.dt_bias[c], skip = p.d[c];
  // A token's own inputs, loaded one token ahead: the compiler cannot move them above the previous token's store
  // of its output (it cannot tell the buffers apart), so without this every token would wait for its loads.
  struct Inputs {
    float delta_raw = 0.0f, u = 0.0f, z = 0.0f;
  };
  const auto load = [&](int64_t t) {
    Inputs in;
    if (t >= end) return in;
    in.delta_raw = p.delta_raw[device_offset(t, num_channels) + c];
    in.u = p.activated[device_offset(t, num_channels) + c];
    if (kOutputs) in.z = p.projected[device_offset(t, 2 * num_channels) + num_channels + c];
    return in;
  };
  Inputs next = load(first);
  float delta_sum = 0.0f;
  for (int64_t t = first; t < end; ++t) {
    const Inputs in = next;
    next = load(t + 1);
    const float step = softplus(in.delta_raw + bias), u = in.u;
    const float* b = staged.values + (t - first) * 2 * state_size;  // B [N], then C [N]
    delta_sum += step;
    float y = 0.0f;
#pragma unroll
    for (int n = 0; n < kMaxStateSize; ++n) {
      if (n >= state_size) continue;
      h[n] = ssm_step(h[n], step, a[n], b[n], u);
      if (kOutputs) y = readout_add(y, h[n], b[state_size + n]);
    }
    if (kOutputs) store_gated(p, device_offset(t, num_channels) + c, gated_output(y, skip, u, in.z));
  }
  return delta_sum;
}

// Pass 1 of the chunked scan, a thread per (chunk, channel): every chunk but its row's last scans its tokens from
// zero state and keeps its last h and the sum of its deltas (then h_end = exp(A * delta_sum) * h_start + that h).
template <int kStateSize>
__global__ void __launch_bounds__(kScanThreads) chunk_end_kernel(const ScanParams p) {
  __shared__ __align__(16) StagedSelective staged;
  const int64_t chunk = blockIdx.y, c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const ChunkView view = chunk_view(p.rows, chunk);
  if (view.is_last) return;
  stage_selective(p, view.first, view.end, staged);
  if (c >= p.layout.num_channels) return;
  const int state_size = kStateSize > 0 ? kStateSize : int(p.layout.state_size);
  float h[kMaxStateSize] = {};
  const float delta_sum = scan_tokens<kStateSize, false>(p, c, view.first, view.end, staged, h);
  float* end_h = p.chunk_end + device_offset(device_offset(chunk, p.layout.num_channels) + c, state_size);
#pragma unroll
  for (int n = 0; n < kMaxStateSize; ++n)
    if (n < state_size) end_h[n] = h[n];
  p.delta_sum[device_offset(chunk, p.layout.num_channels) + c] = delta_sum;
}

// Pass 2, a thread per (row of several tokens, channel, state entry): walks the row's chunks in order from the
// slot's h (reads_state) or zero, writing each chunk's starting h. Reads the slot before pass 3 overwrites it.
__global__ void chunk_start_kernel(const ScanParams p) {
  const DeviceRows& rows = p.rows;
  const int64_t r = blockIdx.y, state_size = p.layout.state_size, num_channels = p.layout.num_channels;
  const int64_t entry = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // c * N + n
  if (entry >= device_offset(num_channels, state_size) || rows.row_tokens[r] <= 1) return;
  const int64_t c = entry / state_size, n = entry % state_size;
  const int64_t first_chunk = rows.row_first_chunk[r];
  const int64_t num_chunks = (rows.row_tokens[r] + kScanChunkTokens - 1) / kScanChunkTokens;
  const float a = p.a[entry];
  float h = rows.reads_state[r] != 0 ? slot_h(p, r, c).get(n) : 0.0f;  // law 1: a row without state starts from zero
  for (int64_t j = 0; j < num_chunks; ++j) {
    const int64_t chunk = first_chunk + j;
    p.chunk_start[device_offset(chunk, device_offset(num_channels, state_size)) + entry] = h;
    if (j + 1 < num_chunks)
      h = __fmaf_rn(expf(__fmul_rn(a, p.delta_sum[device_offset(chunk, num_channels) + c])), h,
                    p.chunk_end[device_offset(chunk, device_offset(num_channels, state_size)) + entry]);
  }
}

// Pass 3, a thread per (chunk, channel): scans its tokens from the chunk's starting h, writing every output; the
// row's last chunk leaves its h in the slot.
template <int kStateSize>
__global__ void __launch_bounds__(kScanThreads) chunk_scan_kernel(const ScanParams p) {
  // out_proj, a skinny GEMM for a step of two tokens, may start early (device_math.cuh).
  let_next_kernel_start();
  __shared__ __align__(16) StagedSelective staged;
  const int64_t chunk = blockIdx.y, c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const ChunkView view = chunk_view(p.rows, chunk);
  stage_selective(p, view.first, view.end, staged);
  if (c >= p.layout.num_channels) return;
  const int state_size = kStateSize > 0 ? kStateSize : int(p.layout.state_size);
  const float* start_h = p.chunk_start + device_offset(device_offset(chunk, p.layout.num_channels) + c, state_size);
  float h[kMaxStateSize];
#pragma unroll
  for (int n = 0; n < kMaxStateSize; ++n)
    if (n < state_size) h[n] = start_h[n];
  scan_tokens<kStateSize, true>(p, c, view.first, view.end, staged, h);
  if (!view.is_last) return;
  const StateValues saved = slot_h(p, view.row, c);
#pragma unroll
  for (int n = 0; n < kMaxStateSize; ++n)
    if (n < state_size) saved.set(n, h[n]);
}

constexpr int kUpdateThreads = 256;
// The one-token update's shape, chosen by timing variants at batch 256 (3B shape, H200, standalone copies of
// the kernel): 2 lanes of 8 entries and 2 channels per thread took 57 us a layer; 4 lanes of 4 and 1 channel, 61; 4 and
// 4 channels, 66; an in-place read-modify-write of the same state bytes and nothing else, 47. In the engine the
// kernel took 68 us (ncu), 69 with 4 lanes and 1 channel; streaming the state (LaneEntries) brought it to 63.
constexpr int kLanesPerChannel = 2;  // threads sharing one channel's N state entries in the one-token update
// Channels per thread in the one-token update: two at batch 256, one for a step of few rows, whose update is a
// latency chain: twice the blocks, each thread half the work. update_channels: a block's channels.
constexpr int kUpdatePasses = 2;
constexpr int kMaxRowsOfOnePass = 2;
__host__ __device__ constexpr int update_channels(int passes) { return kUpdateThreads / kLanesPerChannel * passes; }

// Lane `part`'s kSlots entries of a channel's N values (its state, or its row of A; State is a storage type of
// state_values.h). With N known at compile time (Jamba's 16: kStateSize) they are the contiguous kSlots from
// kSlots * part, moved four at a time in 16-byte (fp32) or 8-byte (bf16) accesses, which needs the values
// 4-aligned; otherwise n = part, part + kLanesPerChannel, ..., one at a time. The state is streamed (kStreamed
// loads and every store evict first from L2): a batch-256 layer moves 84 MB of state through the 50 MB L2 each way,
// which would otherwise evict A and the step's inputs, read by every row.
template <typename State, int kStateSize>
struct LaneEntries {
  static constexpr int kSlots = (kStateSize > 0 ? kStateSize : kMaxStateSize) / kLanesPerChannel;
  static constexpr bool kContiguous = kStateSize > 0 && kSlots % 4 == 0;
  using Quad = std::conditional_t<sizeof(State) == 4, uint4, uint2>;  // four State values

  __device__ static int entry(int part, int k) { return kContiguous ? part * kSlots + k : part + k * kLanesPerChannel; }

  template <bool kStreamed>
  __device__ static void load(const State* values, int part, int state_size, float (&out)[kSlots]) {
    if constexpr (kContiguous) {
#pragma unroll
      for (int q = 0; q < kSlots / 4; ++q) {
        const Quad* address = reinterpret_cast<const Quad*>(values + part * kSlots + 4 * q);
        const Quad quad = kStreamed ? __ldcs(address) : *address;
        const State* four = reinterpret_cast<const State*>(&quad);
#pragma unroll
        for (int k = 0; k < 4; ++k) out[4 * q + k] = widen_state(four[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kSlots; ++k)
        if (entry(part, k) < state_size) out[k] = widen_state(values[entry(part, k)]);
    }
  }

  __device__ static void store(State* values, int part, int state_size, const float (&in)[kSlots]) {
    if constexpr (kContiguous) {
#pragma unroll
      for (int q = 0; q < kSlots / 4; ++q) {
        Quad quad;
        State* four = reinterpret_cast<State*>(&quad);
#pragma unroll
        for (int k = 0; k < 4; ++k) narrow_state(in[4 * q + k], four[k]);
        __stcs(reinterpret_cast<Quad*>(values + part * kSlots + 4 * q), quad);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kSlots; ++k)
        if (entry(part, k) < state_size) narrow_state(in[k], values[entry(part, k)]);
    }
  }
};

// The scan of the rows of one token (decode), in place in the slot: a block per (row, update_channels channels),
// kLanesPerChannel lanes per channel, each taking its LaneEntries of the state and of A; the lanes' shares of h · C
// meet by shuffles. A warp's access covers 16 channels' 16 entries, 1 KB of contiguous fp32 state. Each thread
// takes kPasses channels a block's width of lanes apart and issues all their loads before it computes (the
// kernel is bound by the bytes it keeps in flight); the row's values (its slot, B and C) are read once per block.
// Longer rows are the chunk kernels'.
template <typename State, int kStateSize, int kPasses>
__global__ void __launch_bounds__(kUpdateThreads) selective_state_update_kernel(const ScanParams p) {
  // Launched early, as the kernels around it (device_math.cuh). The rows' data, the slot's state and A are no
  // kernel's output in this step (a step's own writes to the state are this kernel's), so they are loaded before
  // the wait; the scan's inputs after it.
  let_next_kernel_start();
  using Lane = LaneEntries<State, kStateSize>;
  constexpr int kSlots = Lane::kSlots;
  constexpr int kPassChannels = kUpdateThreads / kLanesPerChannel;
  const DeviceRows& rows = p.rows;
  const int64_t r = blockIdx.y;
  // The row's values, loaded together before the branch on them (a load after it would wait for the first).
  const int64_t row_tokens = rows.row_tokens[r], t = rows.first_token[r];
  const bool reads_state = rows.reads_state[r] != 0;
  State* slot = static_cast<State*>(slot_h(p, r, 0).data);  // [Di, N]
  if (row_tokens != 1) return wait_for_previous_kernel();   // every block waits (device_math.cuh)
  const int state_size = kStateSize > 0 ? kStateSize : int(p.layout.state_size);
  const int64_t num_channels = p.layout.num_channels;
  const int part = threadIdx.x % kLanesPerChannel;
  const int64_t first_channel = int64_t(blockIdx.x) * update_channels(kPasses) + threadIdx.x / kLanesPerChannel;
  float h[kPasses][kSlots] = {}, a[kPasses][kSlots], dt_bias[kPasses], skip[kPasses];
#pragma unroll
  for (int j = 0; j < kPasses; ++j) {
    const int64_t channel = first_channel + j * kPassChannels;
    if (channel >= num_channels) break;
    if (reads_state)  // law 1
      Lane::template load<true>(slot + device_offset(channel, state_size), part, state_size, h[j]);
    LaneEntries<float, kStateSize>::template load<false>(p.a + device_offset(channel, state_size), part, state_size,
                                                         a[j]);
    dt_bias[j] = p.dt_bias[channel];
    skip[j] = p.d[channel];
  }
  wait_for_previous_kernel();
  // The scan's inputs, every load issued before any is used: one round trip to L2 where loading u and delta after
  // the barrier below, and z at the end, took three.
  float step[kPasses], u[kPasses], z[kPasses];
#pragma unroll
  for (int j = 0; j < kPasses; ++j) {
    const int64_t channel = first_channel + j * kPassChannels;
    if (channel >= num_channels) break;
    step[j] = p.delta_raw[device_offset(t, num_channels) + channel] + dt_bias[j];
    u[j] = p.activated[device_offset(t, num_channels) + channel];
    if (part == 0) z[j] = p.projected[device_offset(t, 2 * num_channels) + num_channels + channel];
  }
  // The row's B and C, the same for every channel, in shared memory rather than in each lane's registers: 57
  // registers instead of 74 (N = 16), 4 resident blocks per SM instead of 3 (H200, 3B shape, batch 256: 0.06 ms a
  // step less in the layers).
  __shared__ float b[kMaxStateSize], c[kMaxStateSize];
  const float* selective = p.selective + device_offset(t, p.selective_stride) + p.b_column;  // B [N], then C [N]
  if (threadIdx.x < state_size) {
    b[threadIdx.x] = selective[threadIdx.x];
    c[threadIdx.x] = selective[state_size + threadIdx.x];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPasses; ++j) {
    const int64_t channel = first_channel + j * kPassChannels;
    const bool active = channel < num_channels;  // inactive lanes still take part in the shuffles
    float y = 0.0f;
    if (active) {
      const float delta = softplus(step[j]);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int n = Lane::entry(part, k);
        if (n >= state_size) continue;
        h[j][k] = ssm_step(h[j][k], delta, a[j][k], b[n], u[j]);
        y = readout_add(y, h[j][k], c[n]);
      }
      Lane::store(slot + device_offset(channel, state_size), part, state_size, h[j]);
    }
    for (int offset = 1; offset < kLanesPerChannel; offset *= 2) y += __shfl_xor_sync(0xffffffffu, y, offset);
    if (!active || part != 0) continue;
    store_gated(p, device_offset(t, num_channels) + channel, gated_output(y, skip[j], u[j], z[j]));
  }
}

template <typename State, int kStateSize, int kPasses>
void launch_state_update(const ScanParams& params, cudaStream_t stream) {
  const dim3 grid(num_blocks_for(params.layout.num_channels, update_channels(kPasses)), unsigned(params.rows.num_rows));
  launch_early(selective_state_update_kernel<State, kStateSize, kPasses>, grid, dim3(kUpdateThreads), 0, stream,
               params);
}

template <int kStateSize>
void launch_state_update(const ScanParams& params, cudaStream_t stream) {
  const bool f32 = params.state_pool.dtype == DType::F32, one_pass = params.rows.num_rows <= kMaxRowsOfOnePass;
  if (f32 && one_pass)
    launch_state_update<float, kStateSize, 1>(params, stream);
  else if (f32)
    launch_state_update<float, kStateSize, kUpdatePasses>(params, stream);
  else if (one_pass)
    launch_state_update<uint16_t, kStateSize, 1>(params, stream);
  else
    launch_state_update<uint16_t, kStateSize, kUpdatePasses>(params, stream);
}

}  // namespace

void causal_conv1d(const DeviceRows& rows, const MambaStateLayout& layout, const float* projected,
                   const float* conv_weight, const float* conv_bias, StateValues state_pool, float* activated,
                   const Narrow16& activated16, cudaStream_t stream) {
  const int64_t num_outputs = device_offset(rows.num_tokens, layout.num_channels);
  if (num_outputs == 0) return;
  require(layout.num_channels < (int64_t(1) << 31) && num_blocks_for(layout.num_channels, kConvThreads) < 65536,
          "the CUDA conv supports up to " + std::to_string(65535 * kConvThreads) + " Mamba channels, got " +
              std::to_string(layout.num_channels));
  require(layout.kernel_size <= kMaxConvTaps, "the CUDA conv supports d_conv up to " + std::to_string(kMaxConvTaps) +
                                                  ", got " + std::to_string(layout.kernel_size));
  const dim3 grid(num_blocks_for(rows.num_tokens, kConvTokens), num_blocks_for(layout.num_channels, kConvThreads));
  launch_early(conv_outputs_kernel, grid, dim3(kConvThreads, kConvTokens), 0, stream, rows, layout, projected,
               conv_weight, conv_bias, state_pool, activated, activated16);
  if (rows.num_tokens == rows.num_rows) return;  // every row one token: its tail is shifted already
  const int64_t num_tails = device_offset(rows.num_rows, layout.num_channels);
  conv_tail_kernel<<<num_blocks_for(num_tails, kThreads), kThreads, 0, stream>>>(rows, layout, projected, state_pool);
  JAMBO_CUDA_CHECK_LAUNCH(conv_tail_kernel);
}

void selective_scan(const DeviceRows& rows, const MambaStateLayout& layout, const float* activated,
                    const float* delta_raw, const float* dt_bias, const float* selective, int64_t selective_stride,
                    int64_t b_column, const float* projected, const float* a, const float* d, StateValues state_pool,
                    float* gated, const Narrow16& gated16, ScanScratch& scratch, cudaStream_t stream) {
  require(layout.state_size >= 1 && layout.state_size <= kMaxStateSize,
          "the CUDA selective scan supports mamba_d_state up to " + std::to_string(kMaxStateSize) + ", got " +
              std::to_string(layout.state_size));
  require(rows.num_rows < 65536 && rows.num_chunks < 65536,
          "a CUDA scan takes fewer than 65536 rows and 65536 chunks of " + std::to_string(kScanChunkTokens) +
              " tokens per step, got " + std::to_string(rows.num_rows) + " rows and " +
              std::to_string(rows.num_chunks) + " chunks");
  if (rows.num_rows == 0) return;
  const int64_t chunk_states = device_offset(rows.num_chunks, device_offset(layout.num_channels, layout.state_size));
  // Sized before the first launch: growing a buffer frees it.
  float* chunk_end = scratch.chunk_end.reserve(chunk_states);
  float* chunk_start = scratch.chunk_start.reserve(chunk_states);
  float* delta_sum = scratch.delta_sum.reserve(device_offset(rows.num_chunks, layout.num_channels));
  const ScanParams params{rows,      layout,      activated, delta_raw, dt_bias,    selective, selective_stride,
                          b_column,  projected,   a,         d,         state_pool, gated,     gated16,
                          chunk_end, chunk_start, delta_sum};
  const bool jamba_state = layout.state_size == 16;  // every released Jamba: its own compiled loops

  // Contiguous lane entries need every channel's state 4-aligned. Every row's state_offset is a multiple of the slot
  // size (the backend's slot offsets, and the test-only wrap modulus, which must be a multiple of it), and slot and
  // layer offsets are multiples of Di: a multiple of 4 channels (and a 4-aligned layer offset) make them so.
  const bool aligned_state = layout.num_channels % 4 == 0 && layout.layer_offset % 4 == 0;
  if (jamba_state && aligned_state)
    launch_state_update<16>(params, stream);
  else
    launch_state_update<0>(params, stream);
  JAMBO_CUDA_CHECK_LAUNCH(selective_state_update_kernel);
  if (rows.num_chunks == 0) return;  // every row one token: a decode step

  const dim3 chunk_grid(num_blocks_for(layout.num_channels, kScanThreads), unsigned(rows.num_chunks));
  if (jamba_state)
    chunk_end_kernel<16><<<chunk_grid, kScanThreads, 0, stream>>>(params);
  else
    chunk_end_kernel<0><<<chunk_grid, kScanThreads, 0, stream>>>(params);
  JAMBO_CUDA_CHECK_LAUNCH(chunk_end_kernel);
  const dim3 start_grid(num_blocks_for(device_offset(layout.num_channels, layout.state_size), kThreads),
                        unsigned(rows.num_rows));
  chunk_start_kernel<<<start_grid, kThreads, 0, stream>>>(params);
  JAMBO_CUDA_CHECK_LAUNCH(chunk_start_kernel);
  if (jamba_state)
    chunk_scan_kernel<16><<<chunk_grid, kScanThreads, 0, stream>>>(params);
  else
    chunk_scan_kernel<0><<<chunk_grid, kScanThreads, 0, stream>>>(params);
  JAMBO_CUDA_CHECK_LAUNCH(chunk_scan_kernel);
}

}  // namespace jambo::backend::cuda
