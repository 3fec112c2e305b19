#include "backend/cuda/convert.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/embedding_norm.h"
#include "backend/cuda/ffn.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/skinny_gemm.h"

#include <algorithm>
#include <type_traits>

namespace jambo::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxExpertsPerToken = 8;

// kColumns consecutive columns per thread along x (4: one 16-byte load of gate and of up, where I % 4 == 0), rows
// along y (striding past the grid's 65535 limit): no per-element division.
template <int kColumns>
__global__ void swiglu_kernel(const float* gate_up,  // [rows, 2I] gate, then up
                              int64_t num_rows, int64_t intermediate,
                              float* out,        // [rows, I] silu(gate) * up, or null where out16 suffices
                              Narrow16 out16) {  // [rows, I] the same rounded, when present
  // Launched early, as the kernels around it (device_math.cuh).
  let_next_kernel_start();
  wait_for_previous_kernel();
  using Columns = std::conditional_t<kColumns == 4, float4, float>;
  const int64_t column = kColumns * (int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (column >= intermediate) return;
  for (int64_t row = blockIdx.y; row < num_rows; row += gridDim.y) {
    const float* gate = gate_up + device_offset(row, 2 * intermediate) + column;
    const Columns gates = *reinterpret_cast<const Columns*>(gate);
    const Columns ups = *reinterpret_cast<const Columns*>(gate + intermediate);
    const int64_t i = device_offset(row, intermediate) + column;
    float values[kColumns];
#pragma unroll
    for (int j = 0; j < kColumns; ++j) {
      values[j] = swiglu_value(reinterpret_cast<const float*>(&gates)[j], reinterpret_cast<const float*>(&ups)[j]);
      if (out != nullptr) out[i + j] = values[j];
    }
    if (!out16.present()) continue;
    if constexpr (kColumns == 4)
      store_narrow4(out16, i, values);
    else
      store_narrow(out16, i, values[0]);
  }
}

// One thread per token: softmax over the experts in index order, then top-k by repeated arg-max (ties to the
// lowest index), stored in increasing expert order.
__global__ void route_kernel(const float* router_logits,  // [T, E]
                             int64_t num_tokens, int64_t num_experts, int64_t k,
                             int32_t* expert_of,  // [T, k]
                             float* weight_of) {  // [T, k]
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= num_tokens) return;
  const float* logits = router_logits + device_offset(t, num_experts);
  float max_logit = logits[0];
  for (int64_t e = 1; e < num_experts; ++e) max_logit = fmaxf(max_logit, logits[e]);
  float total = 0.0f;
  for (int64_t e = 0; e < num_experts; ++e) total += expf(logits[e] - max_logit);
  int32_t picks[kMaxExpertsPerToken];
  for (int64_t pick = 0; pick < k; ++pick) {
    int32_t best = -1;
    float best_probability = 0.0f;
    for (int32_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t q = 0; q < pick; ++q) taken = taken || picks[q] == e;
      const float probability = expf(logits[e] - max_logit) / total;
      if (!taken && (best < 0 || probability > best_probability)) {
        best = e;
        best_probability = probability;
      }
    }
    picks[pick] = best;
  }
  for (int64_t i = 1; i < k; ++i)  // insertion sort: k is tiny
    for (int64_t j = i; j > 0 && picks[j - 1] > picks[j]; --j) {
      const int32_t swap = picks[j];
      picks[j] = picks[j - 1];
      picks[j - 1] = swap;
    }
  for (int64_t pick = 0; pick < k; ++pick) {
    expert_of[device_offset(t, k) + pick] = picks[pick];
    weight_of[device_offset(t, k) + pick] = expf(logits[picks[pick]] - max_logit) / total;
  }
}

// One block, one thread per expert: expert e's tokens, in token order, take grouped rows
// [expert_rows[e], expert_rows[e + 1]); the experts with rows are listed in increasing order in active_experts,
// whose num_launch_rows = min(E, T*k) entries end in -1s. Deterministic: no atomics.
__global__ void group_kernel(const int32_t* expert_of,  // [T, k]
                             int64_t num_tokens, int64_t num_experts, int64_t k,
                             int32_t* position_of,     // [T, k]
                             int32_t* routed_token,    // [T*k]
                             int64_t* expert_rows,     // [E + 1]
                             int32_t* active_experts,  // [num_launch_rows]
                             int64_t num_launch_rows) {
  const int64_t e = threadIdx.x;
  const int64_t num_choices = device_offset(num_tokens, k);
  if (e < num_experts) {
    int64_t count = 0;
    for (int64_t i = 0; i < num_choices; ++i) count += expert_of[i] == e;
    expert_rows[e + 1] = count;
  }
  __syncthreads();
  if (e == 0) {
    expert_rows[0] = 0;
    int64_t num_active = 0;
    for (int64_t x = 1; x <= num_experts; ++x) {
      if (expert_rows[x] > 0) active_experts[num_active++] = int32_t(x - 1);
      expert_rows[x] += expert_rows[x - 1];
    }
    while (num_active < num_launch_rows) active_experts[num_active++] = -1;
  }
  __syncthreads();
  if (e < num_experts) {
    int64_t row = expert_rows[e];
    for (int64_t i = 0; i < num_choices; ++i) {
      if (expert_of[i] != e) continue;
      position_of[i] = int32_t(row);
      routed_token[row++] = int32_t(i / k);
    }
  }
}

__global__ void combine_kernel(const float* expert_output,  // [T*k, H]
                               const int32_t* position_of,  // [T, k]
                               const float* weight_of,      // [T, k]
                               int64_t num_tokens, int64_t k, int64_t hidden_size,
                               float* out) {  // [T, H]
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= device_offset(num_tokens, hidden_size)) return;
  const int64_t t = i / hidden_size, h = i % hidden_size;
  float sum = 0.0f;
  for (int64_t c = 0; c < k; ++c)
    sum += weight_of[device_offset(t, k) + c] *
           expert_output[device_offset(position_of[device_offset(t, k) + c], hidden_size) + h];
  out[i] = sum;
}

}  // namespace

void swiglu(const float* gate_up, int64_t num_rows, int64_t intermediate, float* out, cudaStream_t stream,
            const Narrow16& out16) {
  if (num_rows == 0) return;
  const unsigned grid_rows = unsigned(std::min<int64_t>(num_rows, 65535));
  if (intermediate % 4 == 0)  // rows then start 16-byte aligned
    launch_early(swiglu_kernel<4>, dim3(num_blocks_for(intermediate / 4, kThreads), grid_rows), dim3(kThreads), 0,
                 stream, gate_up, num_rows, intermediate, out, out16);
  else
    launch_early(swiglu_kernel<1>, dim3(num_blocks_for(intermediate, kThreads), grid_rows), dim3(kThreads), 0, stream,
                 gate_up, num_rows, intermediate, out, out16);
}

namespace {

// The rows' buffers of one MLP: gate_up [rows, 2I]; activation [rows, I], and its copy rounded for a 16-bit
// down_proj (activation16, [rows, I]).
struct MlpBuffers {
  float* gate_up;          // [rows, 2I]
  float* activation;       // [rows, I]
  uint16_t* activation16;  // [rows, I]

  MlpBuffers from_row(int64_t row, int64_t intermediate) const {
    const int64_t offset = device_offset(row, intermediate);
    return {gate_up + 2 * offset, activation + offset, activation16 + offset};
  }
};

// Sized before a step's first launch: growing a buffer frees it.
MlpBuffers reserve_mlp_buffers(FfnWorkspace& workspace, int64_t num_rows, int64_t intermediate) {
  const int64_t count = device_offset(num_rows, intermediate);
  return {workspace.gate_up.reserve(2 * count), workspace.activation.reserve(count),
          workspace.activation16.reserve(count)};
}

// x16: x rounded by its producer, or absent.
void run_mlp(Gemm& gemm, const DeviceMlp& mlp, const float* x, const Narrow16& x16, int64_t num_rows, float* out,
             const MlpBuffers& buffers, cudaStream_t stream) {
  const int64_t intermediate = mlp.down_proj.cols;
  const Narrow16 activation16 =
      mlp.down_proj.dtype == DType::F32 ? Narrow16{} : Narrow16{buffers.activation16, mlp.down_proj.dtype};
  // A 16-bit down_proj reads only the rounded copy (gemm.h), so the fp32 activation is not written then.
  float* activation = activation16.present() ? nullptr : buffers.activation;
  if (linear_swiglu_fuses(gemm, x, num_rows, mlp.gate_up, x16)) {
    linear_swiglu(gemm, x, num_rows, mlp.gate_up, x16, activation, activation16);
  } else {
    linear(gemm, x, num_rows, mlp.gate_up, buffers.gate_up, x16);
    swiglu(buffers.gate_up, num_rows, intermediate, activation, stream, activation16);
  }
  linear(gemm, buffers.activation, num_rows, mlp.down_proj, out, activation16);
}

// Every expert's MLP over its grouped rows, the counts read on the GPU: a launch row for each of active_experts'
// num_launch_rows entries (the experts with rows, then -1s), not for every expert (at batch 1, 2 of 16 have rows).
void run_experts_grouped(const DeviceMoe& moe, const int64_t* expert_rows, const int32_t* active_experts,
                         int64_t num_launch_rows, const float* expert_input, int64_t num_routed,
                         const MlpBuffers& buffers, float* expert_output, cudaStream_t stream) {
  const DeviceMlp& first_expert = moe.experts.front();  // every expert's matrices like these
  const int64_t num_experts = int64_t(moe.experts.size()), intermediate = first_expert.down_proj.cols;
  // Matrix `kind` of every expert (0: gate_up, 1: down_proj), each of `first`'s type and shape.
  const auto gemm = [&](int64_t kind, const DeviceMatrix& first, const float* x, float* y) {
    SkinnyGemm grouped;
    grouped.x = x, grouped.x_stride = first.cols, grouped.group_rows = expert_rows;
    grouped.group_ids = active_experts, grouped.num_groups = num_launch_rows;
    grouped.weights = moe.expert_matrices + device_offset(kind, num_experts), grouped.dtype = first.dtype;
    grouped.n = first.rows, grouped.k = first.cols, grouped.y = y;
    skinny_gemm(grouped, stream);
  };
  gemm(0, first_expert.gate_up, expert_input, buffers.gate_up);
  swiglu(buffers.gate_up, num_routed, intermediate, buffers.activation, stream);
  gemm(1, first_expert.down_proj, buffers.activation, expert_output);
}

// Every expert's MLP on the invariant GEMM, grouped by expert (tensor_gemm_grouped: launch rows as above, at most
// max_expert_rows rows an expert), the inputs of 16-bit matrices rounded to their type as linear() rounds them.
void run_experts_invariant(Gemm& gemm, const DeviceMoe& moe, const int64_t* expert_rows, const int32_t* active_experts,
                           int64_t num_launch_rows, int64_t max_expert_rows, const float* expert_input,
                           int64_t num_routed, const MlpBuffers& buffers, float* expert_output, cudaStream_t stream) {
  const DeviceMlp& first_expert = moe.experts.front();
  const int64_t num_experts = int64_t(moe.experts.size()), intermediate = first_expert.down_proj.cols;
  // Matrix `kind` of every expert (0: gate_up, 1: down_proj), each of `first`'s type and shape.
  const auto gemm_of = [&](int64_t kind, const DeviceMatrix& first, const void* x, float* y) {
    bool aligned = true;
    for (const DeviceMlp& expert : moe.experts) {
      const DeviceMatrix& matrix = kind == 0 ? expert.gate_up : expert.down_proj;
      require(matrix.dtype == first.dtype && matrix.rows == first.rows && matrix.cols == first.cols,
              "the CUDA MoE takes experts of one type and shape (please report this)");
      aligned = aligned && reinterpret_cast<uintptr_t>(matrix.data) % 16 == 0;
    }
    TensorGemm operands;
    operands.dtype = first.dtype, operands.x = x, operands.x_stride = first.cols, operands.y = y;
    operands.num_rows = num_routed, operands.n = first.rows, operands.k = first.cols;
    TensorGemmGroups groups;
    groups.group_rows = expert_rows, groups.group_ids = active_experts;
    groups.weights = moe.expert_matrices + device_offset(kind, num_experts), groups.weights_aligned = aligned;
    groups.num_launch_groups = num_launch_rows, groups.max_group_rows = max_expert_rows;
    tensor_gemm_grouped(operands, groups, gemm.tensor_scratch(), stream);
  };
  const void* gate_up_input = expert_input;
  if (first_expert.gate_up.dtype != DType::F32) {
    const int64_t hidden_size = first_expert.gate_up.cols;
    uint16_t* rounded = gemm.narrow_input(device_offset(num_routed, hidden_size));
    narrow_to_16(expert_input, hidden_size, num_routed, hidden_size, first_expert.gate_up.dtype == DType::BF16, rounded,
                 stream);
    gate_up_input = rounded;
  }
  gemm_of(0, first_expert.gate_up, gate_up_input, buffers.gate_up);
  const bool narrow_down = first_expert.down_proj.dtype != DType::F32;
  swiglu(buffers.gate_up, num_routed, intermediate, narrow_down ? nullptr : buffers.activation, stream,
         narrow_down ? Narrow16{buffers.activation16, first_expert.down_proj.dtype} : Narrow16{});
  gemm_of(1, first_expert.down_proj,
          narrow_down ? static_cast<const void*>(buffers.activation16) : static_cast<const void*>(buffers.activation),
          expert_output);
}

// Each expert's MLP as cuBLAS GEMMs over its rows, sized by the counts read back to the host.
void run_experts_per_expert(Gemm& gemm, const DeviceMoe& moe, const int64_t* expert_rows, const float* expert_input,
                            const MlpBuffers& buffers, float* expert_output, FfnWorkspace& workspace,
                            cudaStream_t stream) {
  const int64_t num_experts = int64_t(moe.experts.size());
  const int64_t intermediate = moe.experts.front().down_proj.cols, hidden_size = moe.experts.front().down_proj.rows;
  workspace.host_expert_rows.resize(size_t(num_experts + 1));
  JAMBO_CUDA_CHECK(cudaMemcpyAsync(workspace.host_expert_rows.data(), expert_rows,
                                   size_t(device_offset(num_experts + 1, sizeof(int64_t))), cudaMemcpyDeviceToHost,
                                   stream));
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t first = workspace.host_expert_rows[e];
    const int64_t count = workspace.host_expert_rows[e + 1] - first;
    if (count == 0) continue;
    run_mlp(gemm, moe.experts[e], expert_input + device_offset(first, hidden_size), {}, count,
            expert_output + device_offset(first, hidden_size), buffers.from_row(first, intermediate), stream);
  }
}

// route_kernel keeps a token's picks in registers, group_kernel takes a thread per expert.
void check_routing(int64_t num_experts, int64_t k) {
  require(k >= 1 && k <= kMaxExpertsPerToken && k <= num_experts,
          "the CUDA MoE supports 1 to " + std::to_string(kMaxExpertsPerToken) +
              " experts per token (and no more than the experts), got " + std::to_string(k));
  require(num_experts <= 1024, "the CUDA MoE supports up to 1024 experts, got " + std::to_string(num_experts));
}

}  // namespace

void route_tokens(const float* router_logits, int64_t num_tokens, int64_t num_experts, int64_t k,
                  const ExpertRouting& routing, cudaStream_t stream) {
  check_routing(num_experts, k);
  if (num_tokens == 0) return;
  route_kernel<<<num_blocks_for(num_tokens, kThreads), kThreads, 0, stream>>>(router_logits, num_tokens, num_experts, k,
                                                                              routing.expert_of, routing.weight_of);
  JAMBO_CUDA_CHECK_LAUNCH(route_kernel);
  const int64_t num_launch_rows = std::min(num_experts, device_offset(num_tokens, k));
  group_kernel<<<1, unsigned((num_experts + 31) / 32 * 32), 0, stream>>>(
      routing.expert_of, num_tokens, num_experts, k, routing.position_of, routing.routed_token, routing.expert_rows,
      routing.active_experts, num_launch_rows);
  JAMBO_CUDA_CHECK_LAUNCH(group_kernel);
}

void combine_experts(const float* expert_output, const ExpertRouting& routing, int64_t num_tokens, int64_t k,
                     int64_t hidden_size, float* out, cudaStream_t stream) {
  if (num_tokens == 0) return;
  combine_kernel<<<num_blocks_for(device_offset(num_tokens, hidden_size), kThreads), kThreads, 0, stream>>>(
      expert_output, routing.position_of, routing.weight_of, num_tokens, k, hidden_size, out);
  JAMBO_CUDA_CHECK_LAUNCH(combine_kernel);
}

bool experts_run_grouped(const DeviceMoe& moe, int64_t num_tokens, ExpertGemms gemms) {
  if (gemms == ExpertGemms::Invariant) return true;
  // Every expert's matrices are like expert 0's; skinny_gemm reads each matrix's K in whole 16-byte loads.
  const DeviceMlp& first = moe.experts.front();
  const bool shapes_fit = first.gate_up.cols % skinny_weights_per_load(first.gate_up.dtype) == 0 &&
                          first.down_proj.cols % skinny_weights_per_load(first.down_proj.dtype) == 0;
  const bool wanted =
      gemms == ExpertGemms::Grouped || (gemms == ExpertGemms::ByTokenCount && num_tokens <= kMaxGroupedTokens);
  return shapes_fit && wanted;
}

void dense_mlp(Gemm& gemm, const DeviceMlp& mlp, const float* x, int64_t num_rows, float* out, FfnWorkspace& workspace,
               cudaStream_t stream, const Narrow16& x16) {
  if (num_rows == 0) return;
  run_mlp(gemm, mlp, x, x16, num_rows, out, reserve_mlp_buffers(workspace, num_rows, mlp.down_proj.cols), stream);
}

void sparse_moe(Gemm& gemm, const DeviceMoe& moe, int64_t num_experts_per_tok, const float* x, int64_t num_tokens,
                float* out, FfnWorkspace& workspace, cudaStream_t stream, const Narrow16& x16, ExpertGemms gemms) {
  if (num_tokens == 0) return;
  const int64_t num_experts = moe.router.rows, hidden_size = moe.router.cols, k = num_experts_per_tok;
  check_routing(num_experts, k);
  const int64_t num_routed = device_offset(num_tokens, k);
  require(num_routed < (int64_t(1) << 31), std::to_string(num_routed) + " routed tokens are too many for one MoE step");
  const int64_t intermediate = moe.experts.front().down_proj.cols;
  // Every buffer is sized before the first launch: growing one frees it.
  float* router_logits = workspace.router_logits.reserve(device_offset(num_tokens, num_experts));
  int32_t* expert_of = workspace.expert_of.reserve(num_routed);
  float* weight_of = workspace.weight_of.reserve(num_routed);
  int32_t* position_of = workspace.position_of.reserve(num_routed);
  int32_t* routed_token = workspace.routed_token.reserve(num_routed);
  int64_t* expert_rows = workspace.expert_rows.reserve(num_experts + 1);
  const int64_t num_launch_rows = std::min(num_experts, num_routed);  // experts that can have rows
  int32_t* active_experts = workspace.active_experts.reserve(num_launch_rows);
  float* expert_input = workspace.expert_input.reserve(device_offset(num_routed, hidden_size));
  float* expert_output = workspace.expert_output.reserve(device_offset(num_routed, hidden_size));
  const MlpBuffers buffers = reserve_mlp_buffers(workspace, num_routed, intermediate);

  const ExpertRouting routing{expert_of, weight_of, position_of, routed_token, expert_rows, active_experts};

  linear(gemm, x, num_tokens, moe.router, router_logits, x16);
  route_tokens(router_logits, num_tokens, num_experts, k, routing, stream);
  gather_rows(x, routed_token, num_routed, hidden_size, expert_input, stream);

  if (gemms == ExpertGemms::Invariant)
    run_experts_invariant(gemm, moe, expert_rows, active_experts, num_launch_rows, /*max_expert_rows=*/num_tokens,
                          expert_input, num_routed, buffers, expert_output, stream);
  else if (experts_run_grouped(moe, num_tokens, gemms))
    run_experts_grouped(moe, expert_rows, active_experts, num_launch_rows, expert_input, num_routed, buffers,
                        expert_output, stream);
  else
    run_experts_per_expert(gemm, moe, expert_rows, expert_input, buffers, expert_output, workspace, stream);
  combine_experts(expert_output, routing, num_tokens, k, hidden_size, out, stream);
}

}  // namespace jambo::backend::cuda
