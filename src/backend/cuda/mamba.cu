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

// After every output has read the old tails: each (row, channel) keeps the last K-1 window entries, and each
// checkpoint inside the row the K-1 entries before it (window indices n .. n+K-2 after n tokens), written first since
// they may read the old tail. In place: the new tail's entry j reads window index num_tokens + j > j, which is not
// yet overwritten.
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
  const auto keep_window = [&](StateValues saved, int64_t num_tokens) {
    for (int64_t j = 0; j < tail_size; ++j)
      saved.set(j, window_at(num_tokens + j, tail_size, reads_state, tail, u_first, u_stride));
  };
  for (int64_t k = rows.row_first_checkpoint[r]; k < rows.row_first_checkpoint[r + 1]; ++k)
    keep_window(checkpoint_tail(rows, layout, state_pool, k, c), rows.checkpoint_tokens[k]);
  keep_window(tail, rows.row_tokens[r]);
}

// The selective scan's operands, one struct for its two kernels (rows of one token, rows of several).
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
};

// The scan's arithmetic, one definition for both kernels and pinned (device_math.cuh), so that a token's update
// and output are the same bits in a prefill and in a decode step:
//   delta = softplus(delta_raw + dt_bias); h = exp(delta * a) * h + delta * b * u; y = h · C (readout_tree);
//   gated = (y + D * u) * silu(z), silu(z) the gate.
__device__ inline float ssm_delta(float delta_raw, float dt_bias) { return softplus(__fadd_rn(delta_raw, dt_bias)); }

__device__ inline float ssm_step(float h, float delta, float a, float b, float u) {
  return __fmaf_rn(expf(__fmul_rn(delta, a)), h, __fmul_rn(__fmul_rn(delta, b), u));
}

__device__ inline float gated_output(float y, float skip, float u, float gate) {
  return __fmul_rn(__fmaf_rn(skip, u, y), gate);
}

constexpr int kMaxStateSize = kWarpSize;

// The terms of a channel's readout: N rounded up to a power of two (Jamba's 16 when compiled for it, else 32), the
// terms past N zero.
template <int kStateSize>
constexpr int kReadoutTerms = kStateSize > 0 ? kStateSize : kMaxStateSize;

// The pairwise sum of kCount values, neighbours first: ((v0 + v1) + (v2 + v3)) + ... (kCount a power of two; the
// values are overwritten).
template <int kCount>
__device__ inline float pairwise_sum(float (&values)[kCount]) {
#pragma unroll
  for (int width = 1; width < kCount; width *= 2)
#pragma unroll
    for (int i = 0; i < kCount; i += 2 * width) values[i] = __fadd_rn(values[i], values[i + width]);
  return values[0];
}

// The readout h · C of one channel, summed in one tree whatever the kernel: its kReadoutTerms products h[n] * C[n]
// pairwise, neighbours first. kLanes adjacent lanes hold a channel's terms, kEntries contiguous ones each: a lane
// sums its own in the tree's first levels (pairwise_sum), then shuffles take the levels above (or the prefill scan
// adds the lanes' sums with pairwise_sum after its chain: the same tree). Every lane of the warp calls it.
template <int kEntries, int kLanes>
__device__ inline float readout_tree(float (&terms)[kEntries]) {
  float y = pairwise_sum<kEntries>(terms);
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) y = __fadd_rn(y, __shfl_xor_sync(0xffffffffu, y, offset));
  return y;
}

__device__ inline void store_gated(const ScanParams& p, int64_t i, float value) {
  if (p.gated != nullptr) p.gated[i] = value;
  if (p.gated16.present()) store_narrow(p.gated16, i, value);
}

// The SSM state of `row` in its slot, from channel c on: [Di - c, N]. It follows the layer's Di conv tails.
__device__ inline StateValues slot_h(const ScanParams& p, int64_t row, int64_t c) {
  return slot_tail(p.rows, p.layout, p.state_pool, row, p.layout.num_channels) + device_offset(c, p.layout.state_size);
}

// Checkpoint k's SSM state of channel c (DeviceRows::checkpoint_offset): [N].
__device__ inline StateValues checkpoint_h(const ScanParams& p, int64_t k, int64_t c) {
  return checkpoint_tail(p.rows, p.layout, p.state_pool, k, p.layout.num_channels) +
         device_offset(c, p.layout.state_size);
}

// Lane `part`'s kSlots entries n = kSlots * part + k of a channel's N values (its state, or its row of A; State is a
// storage type of state_values.h), one of kLanes lanes sharing the channel's kReadoutTerms terms. With N known at
// compile time (Jamba's 16: kStateSize) and the values 4-aligned (kAligned), they move four at a time in 16-byte
// (fp32) or 8-byte (bf16) accesses; otherwise one at a time. kStreamed loads and every store evict first from L2: a
// batch-256 decode layer moves 84 MB of state through the 50 MB L2 each way, which would otherwise evict A and the
// step's inputs, read by every row.
template <typename State, int kStateSize, int kLanes, bool kAligned>
struct LaneEntries {
  static constexpr int kSlots = kReadoutTerms<kStateSize> / kLanes;
  static constexpr bool kQuads = kAligned && kStateSize > 0 && kSlots % 4 == 0;
  using Quad = std::conditional_t<sizeof(State) == 4, uint4, uint2>;  // four State values

  __device__ static int entry(int part, int k) { return part * kSlots + k; }

  template <bool kStreamed>
  __device__ static void load(const State* values, int part, int state_size, float (&out)[kSlots]) {
    if constexpr (kQuads) {
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
    if constexpr (kQuads) {
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

  // One token's update of the lane's entries, and its share of the readout's terms (zero past N).
  __device__ static void step(float (&h)[kSlots], const float (&a)[kSlots], const float* b, const float* c, float delta,
                              float u, int part, int state_size, float (&terms)[kSlots]) {
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int n = entry(part, k);
      terms[k] = 0.0f;
      if (n >= state_size) continue;
      h[k] = ssm_step(h[k], delta, a[k], b[n], u);
      terms[k] = __fmul_rn(h[k], c[n]);
    }
  }
};

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

// The scan of the rows of one token (decode), in place in the slot: a block per (row, update_channels channels),
// kLanesPerChannel lanes per channel, each taking its LaneEntries of the state and of A. A warp's access covers 16
// channels' 16 entries, 1 KB of contiguous fp32 state. Each thread takes kPasses channels a block's width of lanes
// apart and issues all their loads before it computes (the kernel is bound by the bytes it keeps in flight); the
// row's values (its slot, B and C) are read once per block. Rows of several tokens are row_scan_kernel's.
template <typename State, int kStateSize, bool kAligned, int kPasses>
__global__ void __launch_bounds__(kUpdateThreads) selective_state_update_kernel(const ScanParams p) {
  // Launched early, as the kernels around it (device_math.cuh). The rows' data, the slot's state and A are no
  // kernel's output in this step (a step's own writes to the state are this kernel's), so they are loaded before
  // the wait; the scan's inputs after it.
  let_next_kernel_start();
  using Lane = LaneEntries<State, kStateSize, kLanesPerChannel, kAligned>;
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
    LaneEntries<float, kStateSize, kLanesPerChannel, kAligned>::template load<false>(
        p.a + device_offset(channel, state_size), part, state_size, a[j]);
    dt_bias[j] = p.dt_bias[channel];
    skip[j] = p.d[channel];
  }
  wait_for_previous_kernel();
  // The scan's inputs, every load issued before any is used: one round trip to L2 where loading u and delta after
  // the barrier below, and z at the end, took three.
  float delta_raw[kPasses], u[kPasses], z[kPasses];
#pragma unroll
  for (int j = 0; j < kPasses; ++j) {
    const int64_t channel = first_channel + j * kPassChannels;
    if (channel >= num_channels) break;
    delta_raw[j] = p.delta_raw[device_offset(t, num_channels) + channel];
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
    float terms[kSlots] = {};
    if (active) Lane::step(h[j], a[j], b, c, ssm_delta(delta_raw[j], dt_bias[j]), u[j], part, state_size, terms);
    const float y = readout_tree<kSlots, kLanesPerChannel>(terms);
    if (!active) continue;
    Lane::store(slot + device_offset(channel, state_size), part, state_size, h[j]);
    if (part == 0) store_gated(p, device_offset(t, num_channels) + channel, gated_output(y, skip[j], u[j], silu(z[j])));
  }
}

template <typename State, int kStateSize, bool kAligned, int kPasses>
void launch_state_update(const ScanParams& params, cudaStream_t stream) {
  const dim3 grid(num_blocks_for(params.layout.num_channels, update_channels(kPasses)), unsigned(params.rows.num_rows));
  launch_early(selective_state_update_kernel<State, kStateSize, kAligned, kPasses>, grid, dim3(kUpdateThreads), 0,
               stream, params);
}

template <typename State, int kStateSize, bool kAligned>
void launch_state_update(const ScanParams& params, cudaStream_t stream) {
  if (params.rows.num_rows <= kMaxRowsOfOnePass)
    launch_state_update<State, kStateSize, kAligned, 1>(params, stream);
  else
    launch_state_update<State, kStateSize, kAligned, kUpdatePasses>(params, stream);
}

// Tokens the prefill scan stages at a time.
constexpr int kScanStageTokens = 32;

constexpr int kRowScanThreads = 128;
constexpr int kScanUnroll = 4;  // tokens of the prefill scan's loop unrolled: their off-chain work interleaves
// Lanes per channel of the prefill scan: a row's scan is one chain of tokens, so a step of few rows takes more lanes
// (more of the GPU busy on each), one of many fewer (less work a token). The readout's tree is the same either way.
constexpr int kRowScanLanesFew = 8, kRowScanLanesMany = 4;
constexpr int64_t kMaxRowsOfFewScans = 4;  // rows of several tokens in a step that take kRowScanLanesFew

template <int kLanes>
constexpr int kRowScanChannels = kRowScanThreads / kLanes;

// A stage of the prefill scan in shared memory, so that no token of the scan's chain waits for a load: the B and C
// of its tokens, which every channel of the block reads [kScanStageTokens, 2 N]; its channels' per-token values,
// each computed once for the channel's lanes: delta = ssm_delta, u and the gate silu(z) [kScanStageTokens,
// kRowScanChannels]; and each lane's share of each token's readout, summed after the chain [kScanStageTokens,
// kRowScanThreads] (a token's lanes adjacent), so that no shuffle sits in the chain's loop.
template <int kLanes>
struct ScanStage {
  float selective[kScanStageTokens * 2 * kMaxStateSize];
  float delta[kScanStageTokens][kRowScanChannels<kLanes>];
  float u[kScanStageTokens][kRowScanChannels<kLanes>];
  float gate[kScanStageTokens][kRowScanChannels<kLanes>];
  float readout[kScanStageTokens][kRowScanThreads];
};

// A thread's share of a stage's inputs as loaded from global memory: the next stage's loads are in flight while the
// chain runs through this one. Entry i of the channels' values is (token, channel) threadIdx.x + i * kRowScanThreads
// of [tokens, kRowScanChannels]; entry i of B and C, (token, column) threadIdx.x + i * kRowScanThreads of
// [tokens, 2 N].
template <int kLanes>
struct StageLoads {
  static constexpr int kValues = kScanStageTokens * kRowScanChannels<kLanes> / kRowScanThreads;
  static constexpr int kSelective = kScanStageTokens * 2 * kMaxStateSize / kRowScanThreads;
  float delta_raw[kValues], u[kValues], z[kValues], selective[kSelective];
};

// Loads tokens [first, first + num_tokens) for channels first_channel .. + kRowScanChannels (those past Di repeat
// the last).
template <int kLanes>
__device__ void load_stage(const ScanParams& p, int64_t first, int num_tokens, int64_t first_channel,
                           StageLoads<kLanes>& loads) {
  constexpr int kChannels = kRowScanChannels<kLanes>;
  const int64_t num_channels = p.layout.num_channels;
#pragma unroll
  for (int e = 0; e < StageLoads<kLanes>::kValues; ++e) {
    const int i = int(threadIdx.x) + e * kRowScanThreads, k = i / kChannels;
    if (k >= num_tokens) break;
    const int64_t t = first + k, c = min(first_channel + i % kChannels, num_channels - 1);
    loads.delta_raw[e] = p.delta_raw[device_offset(t, num_channels) + c];
    loads.u[e] = p.activated[device_offset(t, num_channels) + c];
    loads.z[e] = p.projected[device_offset(t, 2 * num_channels) + num_channels + c];
  }
  const int width = 2 * int(p.layout.state_size);
#pragma unroll
  for (int e = 0; e < StageLoads<kLanes>::kSelective; ++e) {
    const int i = int(threadIdx.x) + e * kRowScanThreads;
    if (i >= num_tokens * width) break;
    loads.selective[e] = p.selective[device_offset(first + i / width, p.selective_stride) + p.b_column + i % width];
  }
}

// Writes the loads of a stage of num_tokens tokens into `stage`, delta and the gate computed.
template <int kLanes>
__device__ void store_stage(const ScanParams& p, const StageLoads<kLanes>& loads, int num_tokens,
                            int64_t first_channel, ScanStage<kLanes>& stage) {
  constexpr int kChannels = kRowScanChannels<kLanes>;
#pragma unroll
  for (int e = 0; e < StageLoads<kLanes>::kValues; ++e) {
    const int i = int(threadIdx.x) + e * kRowScanThreads, k = i / kChannels, j = i % kChannels;
    if (k >= num_tokens) break;
    const int64_t c = min(first_channel + j, p.layout.num_channels - 1);
    stage.delta[k][j] = ssm_delta(loads.delta_raw[e], p.dt_bias[c]);
    stage.u[k][j] = loads.u[e];
    stage.gate[k][j] = silu(loads.z[e]);
  }
  const int width = 2 * int(p.layout.state_size);
#pragma unroll
  for (int e = 0; e < StageLoads<kLanes>::kSelective; ++e) {
    const int i = int(threadIdx.x) + e * kRowScanThreads;
    if (i >= num_tokens * width) break;
    stage.selective[i] = loads.selective[e];
  }
}

// The scan of a row of several tokens (prefill), in time order from its slot's state (or zero, law 1) to its new
// state in the slot: a block per (row, kRowScanChannels channels), kLanes lanes per channel. Each token takes the
// one-token update's arithmetic (ssm_delta, LaneEntries::step, the readout's pairwise tree, gated_output), so a
// row's outputs and state do not depend on how its prompt was cut into steps, nor on the rows beside it; a bf16
// state is rounded where the row's step ends. The block stages kScanStageTokens tokens' B and C and its channels'
// values at a time (ScanStage), runs the chain through them while the next stage's loads are in flight
// (StageLoads), then sums the readouts' lanes and writes the gated outputs. A stage also ends at each checkpoint
// inside the row (DeviceRows), where h is stored into the checkpoint as into a slot; the staging moves no token's
// arithmetic. Launched over the step's chunks: the block of a row's first chunk scans the row, the others leave at
// once.
template <typename State, int kStateSize, bool kAligned, int kLanes>
__global__ void __launch_bounds__(kRowScanThreads) row_scan_kernel(const ScanParams p) {
  static_assert(kWarpSize % kLanes == 0 && kReadoutTerms<kStateSize> % kLanes == 0, "a channel's lanes share a warp");
  // out_proj, a skinny GEMM for a step of two tokens, may start early (device_math.cuh).
  let_next_kernel_start();
  using Lane = LaneEntries<State, kStateSize, kLanes, kAligned>;
  constexpr int kSlots = Lane::kSlots;
  __shared__ ScanStage<kLanes> stage;
  const DeviceRows& rows = p.rows;
  const int64_t chunk = blockIdx.y, r = rows.chunk_row[chunk];
  const int64_t first = rows.first_token[r], end = first + rows.row_tokens[r];
  if (rows.chunk_first_token[chunk] != first) return;
  const int state_size = kStateSize > 0 ? kStateSize : int(p.layout.state_size);
  const int64_t num_channels = p.layout.num_channels;
  const int part = threadIdx.x % kLanes, j = threadIdx.x / kLanes;
  const int64_t first_channel = int64_t(blockIdx.x) * kRowScanChannels<kLanes>, c = first_channel + j;
  const bool active = c < num_channels;                           // inactive lanes scan a copy of the last
  const int64_t channel = active ? c : num_channels - 1;          // channel, never stored
  State* slot = static_cast<State*>(slot_h(p, r, channel).data);  // [N]
  float h[kSlots] = {}, a[kSlots] = {};
  if (rows.reads_state[r] != 0) Lane::template load<false>(slot, part, state_size, h);  // law 1
  LaneEntries<float, kStateSize, kLanes, kAligned>::template load<false>(p.a + device_offset(channel, state_size), part,
                                                                         state_size, a);
  // A stage ends at the row's next checkpoint, if one comes first: the state there is h after the stage's chain.
  const int64_t first_checkpoint = rows.row_first_checkpoint[r], end_checkpoint = rows.row_first_checkpoint[r + 1];
  const auto tokens_from = [&](int64_t token) {
    int64_t until = min(end, token + kScanStageTokens);
    for (int64_t k = first_checkpoint; k < end_checkpoint; ++k)
      if (first + rows.checkpoint_tokens[k] > token) {
        until = min(until, first + rows.checkpoint_tokens[k]);
        break;
      }
    return int(until - token);
  };
  int64_t checkpoint = first_checkpoint;
  StageLoads<kLanes> loads;
  load_stage(p, first, tokens_from(first), first_channel, loads);
  int num_tokens = 0;
  for (int64_t stage_first = first; stage_first < end; stage_first += num_tokens) {
    num_tokens = tokens_from(stage_first);
    store_stage(p, loads, num_tokens, first_channel, stage);
    __syncthreads();
    if (stage_first + num_tokens < end)
      load_stage(p, stage_first + num_tokens, tokens_from(stage_first + num_tokens), first_channel, loads);
#pragma unroll kScanUnroll
    for (int k = 0; k < num_tokens; ++k) {
      const float* b = stage.selective + k * 2 * state_size;  // B [N], then C [N]
      float terms[kSlots];
      Lane::step(h, a, b, b + state_size, stage.delta[k][j], stage.u[k][j], part, state_size, terms);
      stage.readout[k][threadIdx.x] = pairwise_sum<kSlots>(terms);
    }
    if (checkpoint < end_checkpoint && stage_first + num_tokens == first + rows.checkpoint_tokens[checkpoint]) {
      if (active) Lane::store(static_cast<State*>(checkpoint_h(p, checkpoint, channel).data), part, state_size, h);
      ++checkpoint;
    }
    __syncthreads();
    // The readout's levels above the lanes, and the gated outputs: a thread per (token, channel), channels adjacent.
    constexpr int kChannels = kRowScanChannels<kLanes>;
    for (int i = int(threadIdx.x); i < num_tokens * kChannels; i += kRowScanThreads) {
      const int k = i / kChannels, jj = i % kChannels;
      const int64_t cc = first_channel + jj;
      if (cc >= num_channels) continue;
      float lane_sums[kLanes];
#pragma unroll
      for (int l = 0; l < kLanes; ++l) lane_sums[l] = stage.readout[k][jj * kLanes + l];
      const float y = pairwise_sum<kLanes>(lane_sums);
      store_gated(p, device_offset(stage_first + k, num_channels) + cc,
                  gated_output(y, p.d[cc], stage.u[k][jj], stage.gate[k][jj]));
    }
    __syncthreads();  // the stage is rewritten next
  }
  if (active) Lane::store(slot, part, state_size, h);
}

template <typename State, int kStateSize, bool kAligned, int kLanes>
void launch_row_scan(const ScanParams& params, cudaStream_t stream) {
  const dim3 grid(num_blocks_for(params.layout.num_channels, kRowScanChannels<kLanes>),
                  unsigned(params.rows.num_chunks));
  row_scan_kernel<State, kStateSize, kAligned, kLanes><<<grid, kRowScanThreads, 0, stream>>>(params);
  JAMBO_CUDA_CHECK_LAUNCH(row_scan_kernel);
}

// Both kernels of a step, for one state type and layout.
template <typename State, int kStateSize, bool kAligned>
void launch_scan(const ScanParams& params, cudaStream_t stream) {
  launch_state_update<State, kStateSize, kAligned>(params, stream);
  JAMBO_CUDA_CHECK_LAUNCH(selective_state_update_kernel);
  if (params.rows.num_chunks == 0) return;  // every row one token: a decode step
  if (params.rows.num_chunked_rows <= kMaxRowsOfFewScans)
    launch_row_scan<State, kStateSize, kAligned, kRowScanLanesFew>(params, stream);
  else
    launch_row_scan<State, kStateSize, kAligned, kRowScanLanesMany>(params, stream);
}

template <typename State>
void launch_scan(const ScanParams& params, cudaStream_t stream) {
  // Quads of state entries need every channel's state 4-aligned. Every row's state_offset is a multiple of the slot
  // size (the backend's slot offsets, and the test-only wrap modulus, which must be a multiple of it), and slot and
  // layer offsets are multiples of Di: a multiple of 4 channels (and a 4-aligned layer offset) make them so.
  const MambaStateLayout& layout = params.layout;
  const bool aligned = layout.num_channels % 4 == 0 && layout.layer_offset % 4 == 0;
  if (layout.state_size == 16 && aligned)  // every released Jamba: its own compiled loops
    launch_scan<State, 16, true>(params, stream);
  else
    launch_scan<State, 0, false>(params, stream);
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
                    float* gated, const Narrow16& gated16, cudaStream_t stream) {
  require(layout.state_size >= 1 && layout.state_size <= kMaxStateSize,
          "the CUDA selective scan supports mamba_d_state up to " + std::to_string(kMaxStateSize) + ", got " +
              std::to_string(layout.state_size));
  require(rows.num_rows < 65536 && rows.num_chunks < 65536,
          "a CUDA scan takes fewer than 65536 rows and 65536 chunks of " + std::to_string(kScanChunkTokens) +
              " tokens per step, got " + std::to_string(rows.num_rows) + " rows and " +
              std::to_string(rows.num_chunks) + " chunks");
  if (rows.num_rows == 0) return;
  const ScanParams params{rows,     layout,    activated, delta_raw, dt_bias,    selective, selective_stride,
                          b_column, projected, a,         d,         state_pool, gated,     gated16};
  if (state_pool.dtype == DType::F32)
    launch_scan<float>(params, stream);
  else
    launch_scan<uint16_t>(params, stream);
}

}  // namespace jambo::backend::cuda
