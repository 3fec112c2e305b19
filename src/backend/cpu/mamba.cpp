#include "backend/cpu/mamba.h"

#include "backend/cpu/gemm.h"
#include "backend/cpu/vector_ops.h"

#include <algorithm>
#include <vector>

namespace jambo::backend::cpu {
namespace {

// Runs body(row, channel) for every row and channel in one parallel loop, so a step of many
// decode rows pays for one thread fork, not one per row.
template <typename Body>
void for_each_row_and_channel(std::span<const MambaRow> rows, int64_t num_channels, Body body) {
  const int64_t num_items = int64_t(rows.size()) * num_channels;
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < num_items; ++item) body(rows[item / num_channels], item % num_channels);
}

// One channel of the causal depthwise conv and its SiLU:
// activated[t] = silu(sum_j conv[j] * window[t + j] + conv_bias) where window is the row's conv
// tail (zeros without initial state) followed by this step's inputs u. The last K-1 entries of the
// window become the new tail.
void causal_conv_channel(const model::MambaWeights& weights, int64_t kernel_size,
                         const Matrix& projected,  // [num_tokens, 2*Di]; columns 0..Di-1 are u
                         const MambaRow& row, int64_t channel,
                         Matrix& activated) {  // [num_tokens, Di]
  const int64_t tail_size = kernel_size - 1;
  const StateValues tail = row.conv_tail + element_offset(channel, tail_size);  // [K-1]
  auto window = [&](int64_t index) {
    if (index >= tail_size) return projected.row(row.first_token + index - tail_size)[channel];
    return row.has_initial_state ? tail.get(index) : 0.0f;
  };
  const int64_t first_tap = element_offset(channel, kernel_size);
  const float bias = weights.conv_bias.empty() ? 0.0f : weights.conv_bias.at(channel);
  for (int64_t t = 0; t < row.num_tokens; ++t) {
    float sum = 0.0f;
    for (int64_t j = 0; j < kernel_size; ++j) sum += weights.conv_weight.at(first_tap + j) * window(t + j);
    activated.row(row.first_token + t)[channel] = silu(sum + bias);
  }
  for (const MambaCheckpoint& checkpoint : row.checkpoints) {  // the tail as it is after num_tokens inputs
    const StateValues saved = checkpoint.conv_tail + element_offset(channel, tail_size);
    for (int64_t j = 0; j < tail_size; ++j) saved.set(j, window(checkpoint.num_tokens + j));
  }
  // In place: entry j reads window index num_tokens + j > j, which is not yet overwritten.
  for (int64_t j = 0; j < tail_size; ++j) tail.set(j, window(row.num_tokens + j));
}

// One channel of the sequential selective scan in fp32, with the D skip and the gate:
// h = exp(delta * A) * h + delta * B * u;  y = (h · C + D * u) * silu(z).
void selective_scan_channel(const model::MambaWeights& weights, const model::JambaConfig& config,
                            const Matrix& activated,  // [num_tokens, Di] u after conv and SiLU
                            const Matrix& delta,      // [num_tokens, Di] softplus(dt_proj(dt) + bias)
                            const Matrix& b_normed,   // [num_tokens, N]
                            const Matrix& c_normed,   // [num_tokens, N]
                            const Matrix& projected,  // [num_tokens, 2*Di]; columns Di..2Di-1 are z
                            const MambaRow& row, int64_t channel,
                            Matrix& gated) {  // [num_tokens, Di]
  const int64_t num_channels = config.mamba_d_inner;
  const int64_t state_size = config.mamba_d_state;
  const StateValues saved_h = row.ssm_state + element_offset(channel, state_size);  // [N]
  thread_local std::vector<float> a, h;  // [N] A = -exp(A_log), and the state as it evolves
  a.resize(size_t(state_size));
  h.resize(size_t(state_size));
  for (int64_t n = 0; n < state_size; ++n) {
    a[n] = -std::exp(weights.A_log.at(element_offset(channel, state_size) + n));
    h[n] = row.has_initial_state ? saved_h.get(n) : 0.0f;
  }

  const float skip = weights.D.at(channel);
  auto checkpoint = row.checkpoints.begin();
  for (int64_t t = row.first_token; t < row.first_token + row.num_tokens; ++t) {
    const float step = delta.row(t)[channel];
    const float u = activated.row(t)[channel];
    const float* b = b_normed.row(t);
    const float* c = c_normed.row(t);
    float y = 0.0f;
    for (int64_t n = 0; n < state_size; ++n) {
      h[n] = std::exp(step * a[n]) * h[n] + step * b[n] * u;
      y += h[n] * c[n];
    }
    gated.row(t)[channel] = (y + skip * u) * silu(projected.row(t)[num_channels + channel]);
    if (checkpoint != row.checkpoints.end() && t + 1 - row.first_token == checkpoint->num_tokens) {
      const StateValues saved = checkpoint->ssm_state + element_offset(channel, state_size);
      for (int64_t n = 0; n < state_size; ++n) saved.set(n, h[n]);
      ++checkpoint;
    }
  }
  for (int64_t n = 0; n < state_size; ++n) saved_h.set(n, h[n]);
}

// The mixer's intermediates, kept from call to call (per thread) so that each layer and step
// reuses their storage instead of allocating and faulting in fresh pages.
struct Intermediates {
  Matrix projected;  // [num_tokens, 2*Di]: u then z
  Matrix activated;  // [num_tokens, Di]
  Matrix selective;  // [num_tokens, R + 2N]: dt, B, C
  Matrix dt_normed;  // [num_tokens, R]
  Matrix b_normed;   // [num_tokens, N]
  Matrix c_normed;   // [num_tokens, N]
  Matrix delta;      // [num_tokens, Di]
  Matrix gated;      // [num_tokens, Di]
};

}  // namespace

void mamba_mixer(const model::MambaWeights& weights, const model::JambaConfig& config, const Matrix& x,
                 std::span<const MambaRow> rows, Matrix& out, Communicator* communicator) {
  const int64_t num_tokens = x.num_rows();
  const int64_t num_channels = config.mamba_d_inner;
  const int64_t dt_rank = config.mamba_dt_rank;
  const int64_t state_size = config.mamba_d_state;
  const float eps = float(config.rms_norm_eps);

  // Used through references: a thread_local named inside a lambda run by a worker is the worker's own. Named
  // references rather than a structured binding, which lambdas cannot capture in clang 14 (the sanitizer build).
  thread_local Intermediates kept;
  Matrix &projected = kept.projected, &activated = kept.activated, &selective = kept.selective;
  Matrix &dt_normed = kept.dt_normed, &b_normed = kept.b_normed, &c_normed = kept.c_normed;
  Matrix &delta = kept.delta, &gated = kept.gated;
  matmul(x, weights.in_proj, projected);
  add_bias(projected, weights.in_proj_bias);

  activated.resize(num_tokens, num_channels);  // every token belongs to a row, so every entry is written
  for_each_row_and_channel(rows, num_channels, [&](const MambaRow& row, int64_t channel) {
    causal_conv_channel(weights, config.mamba_d_conv, projected, row, channel, activated);
  });

  matmul(activated, weights.x_proj, selective);
  if (communicator != nullptr)
    communicator->all_reduce_sum({selective.data(), size_t(selective.num_rows() * selective.num_cols())});
  dt_normed.resize(num_tokens, dt_rank);
  b_normed.resize(num_tokens, state_size);
  c_normed.resize(num_tokens, state_size);
  parallel_for(num_tokens, selective.num_cols(), [&](int64_t t) {
    rms_norm(selective.row(t), weights.dt_norm, eps, dt_normed.row(t));
    rms_norm(selective.row(t) + dt_rank, weights.b_norm, eps, b_normed.row(t));
    rms_norm(selective.row(t) + dt_rank + state_size, weights.c_norm, eps, c_normed.row(t));
  });

  matmul(dt_normed, weights.dt_proj, delta);
  add_bias(delta, weights.dt_proj_bias);
  parallel_for(num_tokens, num_channels, [&](int64_t t) {
    for (int64_t c = 0; c < num_channels; ++c) delta.row(t)[c] = softplus(delta.row(t)[c]);
  });

  gated.resize(num_tokens, num_channels);  // every entry is written, as for activated
  for_each_row_and_channel(rows, num_channels, [&](const MambaRow& row, int64_t channel) {
    selective_scan_channel(weights, config, activated, delta, b_normed, c_normed, projected, row, channel, gated);
  });

  matmul(gated, weights.out_proj, out);
  add_bias(out, weights.out_proj_bias);
}

}  // namespace jambo::backend::cpu
