#include "backend/cuda/mixers.h"

#include "backend/cuda/embedding_norm.h"
#include "backend/cuda/gemm.h"
#include "core/tensor.h"

namespace jambo::backend::cuda {

void mamba_mixer(Gemm& gemm, const DeviceMamba& w, const model::JambaConfig& config, const MambaStateLayout& layout,
                 const DeviceRows& rows, const float* x, StateValues state_pool, float* out, MambaScratch& scratch,
                 cudaStream_t stream, const Narrow16& x16, DeviceCommunicator* communicator) {
  const int64_t num_tokens = rows.num_tokens, inner = config.mamba_d_inner;
  const int64_t dt_rank = config.mamba_dt_rank, state_size = config.mamba_d_state;
  const int64_t selective_width = dt_rank + 2 * state_size;
  const float eps = float(config.rms_norm_eps);
  // Every buffer is sized before the first launch (growing one frees it).
  float* projected = scratch.projected.reserve(element_offset(num_tokens, 2 * inner));
  float* activated = scratch.activated.reserve(element_offset(num_tokens, inner));
  float* selective = scratch.selective.reserve(element_offset(num_tokens, selective_width));
  float* delta = scratch.delta.reserve(element_offset(num_tokens, inner));
  float* gated = scratch.gated.reserve(element_offset(num_tokens, inner));
  // The producers of x_proj's, dt_proj's and out_proj's inputs write their 16-bit copies (narrow16.h).
  const auto narrow_copy = [](DeviceBuffer<uint16_t>& buffer, int64_t num_elements, const DeviceMatrix& consumer) {
    return consumer.dtype == DType::F32 ? Narrow16{} : Narrow16{buffer.reserve(num_elements), consumer.dtype};
  };
  const Narrow16 activated16 = narrow_copy(scratch.activated16, element_offset(num_tokens, inner), w.x_proj);
  const Narrow16 dt16 = narrow_copy(scratch.dt16, element_offset(num_tokens, dt_rank), w.dt_proj);
  const Narrow16 gated16 = narrow_copy(scratch.gated16, element_offset(num_tokens, inner), w.out_proj);

  // Decode steps of few rows run the conv in in_proj's GEMM (DecodeConv) where in_proj has no bias to add first.
  const DecodeConv conv{rows, layout, w.conv_weight, w.conv_bias, state_pool, activated, activated16};
  if (w.in_proj_bias == nullptr && linear_conv_fuses(gemm, x, num_tokens, w.in_proj, x16, conv)) {
    linear_conv(gemm, x, num_tokens, w.in_proj, x16, projected, conv);
  } else {
    linear(gemm, x, num_tokens, w.in_proj, projected, x16);
    add_bias(projected, num_tokens, 2 * inner, w.in_proj_bias, stream);
    causal_conv1d(rows, layout, projected, w.conv_weight, w.conv_bias, state_pool, activated, activated16, stream);
  }
  linear(gemm, activated, num_tokens, w.x_proj, selective, activated16);
  if (communicator != nullptr)
    communicator->all_reduce_sum(selective, element_offset(num_tokens, selective_width), stream);
  const NormSegment norms[] = {{0, dt_rank, w.dt_norm, dt16},
                               {dt_rank, state_size, w.b_norm, {}},
                               {dt_rank + state_size, state_size, w.c_norm, {}}};
  rms_norm_segments(selective, selective_width, num_tokens, norms, eps, stream);
  // dt_proj reads the normalized dt columns in place (a strided GEMM input, no copy), or their 16-bit copy.
  linear_strided(gemm, selective, selective_width, num_tokens, w.dt_proj, delta, dt16);
  // A 16-bit out_proj reads only the rounded copy (gemm.h), so the scan writes no fp32 output then.
  selective_scan(rows, layout, activated, delta, w.dt_proj_bias, selective, selective_width, dt_rank, projected, w.a,
                 w.d, state_pool, gated16.present() ? nullptr : gated, gated16, stream);
  linear(gemm, gated, num_tokens, w.out_proj, out, gated16);
  add_bias(out, num_tokens, config.hidden_size, w.out_proj_bias, stream);
}

void attention_mixer(Gemm& gemm, const DeviceAttention& w, const model::JambaConfig& config, const KvLayout& layout,
                     const DeviceRows& rows, const float* x, float* kv_pool, float* out, AttentionScratch& scratch,
                     cudaStream_t stream, const Narrow16& x16) {
  const int64_t num_tokens = rows.num_tokens;
  const int64_t query_width = config.num_attention_heads * config.head_dim;
  const int64_t kv_width = config.num_key_value_heads * config.head_dim;
  float* queries = scratch.queries.reserve(element_offset(num_tokens, query_width));
  float* keys = scratch.keys.reserve(element_offset(num_tokens, kv_width));
  float* values = scratch.values.reserve(element_offset(num_tokens, kv_width));
  float* context = scratch.context.reserve(element_offset(num_tokens, query_width));
  linear(gemm, x, num_tokens, w.q_proj, queries, x16);
  linear(gemm, x, num_tokens, w.k_proj, keys, x16);
  linear(gemm, x, num_tokens, w.v_proj, values, x16);
  store_keys_and_values(rows, layout, keys, values, kv_pool, stream);
  // The 16-bit mode (its weights are 16-bit) rounds attention's inputs as it rounds every GEMM's.
  const bool sixteen_bit = w.q_proj.dtype != DType::F32;
  paged_attention(rows, layout, config.num_attention_heads, queries, kv_pool, context, scratch.partial, sixteen_bit,
                  stream);
  linear(gemm, context, num_tokens, w.o_proj, out);
}

}  // namespace jambo::backend::cuda
