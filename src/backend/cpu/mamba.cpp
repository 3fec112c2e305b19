#include "backend/cpu/mamba.h"

#include "backend/cpu/matmul.h"
#include "backend/cpu/vector_ops.h"

#include <algorithm>
#include <vector>

namespace jambo::cpu {
namespace {

// activated[t, c] = silu(conv_bias[c] + sum_j conv[c, j] * window[t + j]) where window is the
// row's conv tail followed by this step's inputs u; the last K-1 inputs become the new tail.
void causal_conv(const MambaWeights& weights, const JambaConfig& config,
                 const Matrix& projected,  // [num_tokens, 2*Di]; columns 0..Di-1 are u
                 const MambaRow& row,
                 Matrix& activated) {      // [num_tokens, Di]
  const int64_t num_channels = config.mamba_d_inner;
  const int64_t kernel_size = config.mamba_d_conv;
  const int64_t tail_size = kernel_size - 1;
#pragma omp parallel
  {
    std::vector<float> window(size_t(tail_size + row.num_tokens));  // [K-1 + T]
#pragma omp for schedule(static)
    for (int64_t channel = 0; channel < num_channels; ++channel) {
      float* tail = row.conv_tail + element_offset(channel, tail_size);
      for (int64_t j = 0; j < tail_size; ++j) window[j] = row.has_initial_state ? tail[j] : 0.0f;
      for (int64_t t = 0; t < row.num_tokens; ++t) window[tail_size + t] = projected.row(row.first_token + t)[channel];

      const int64_t first_tap = element_offset(channel, kernel_size);
      const float bias = weights.conv_bias.empty() ? 0.0f : weights.conv_bias.at(channel);
      for (int64_t t = 0; t < row.num_tokens; ++t) {
        float sum = 0.0f;
        for (int64_t j = 0; j < kernel_size; ++j) sum += weights.conv_weight.at(first_tap + j) * window[t + j];
        activated.row(row.first_token + t)[channel] = silu(sum + bias);
      }
      for (int64_t j = 0; j < tail_size; ++j) tail[j] = window[row.num_tokens + j];
    }
  }
}

// The sequential selective scan of one row, per channel, in fp32, with the D skip and the gate:
// h = exp(delta * A) * h + delta * B * u;  y = (h · C + D * u) * silu(z).
void selective_scan(const MambaWeights& weights, const JambaConfig& config,
                    const Matrix& activated,  // [num_tokens, Di] u after conv and SiLU
                    const Matrix& delta,      // [num_tokens, Di] softplus(dt_proj(dt) + bias)
                    const Matrix& b_normed,   // [num_tokens, N]
                    const Matrix& c_normed,   // [num_tokens, N]
                    const Matrix& projected,  // [num_tokens, 2*Di]; columns Di..2Di-1 are z
                    const MambaRow& row,
                    Matrix& gated) {          // [num_tokens, Di]
  const int64_t num_channels = config.mamba_d_inner;
  const int64_t state_size = config.mamba_d_state;
#pragma omp parallel
  {
    std::vector<float> a(static_cast<size_t>(state_size));  // [N] A = -exp(A_log) of one channel
    std::vector<float> h(static_cast<size_t>(state_size));  // [N] the channel's state
#pragma omp for schedule(static)
    for (int64_t channel = 0; channel < num_channels; ++channel) {
      float* saved_h = row.ssm_state + element_offset(channel, state_size);  // [N]
      const int64_t first_a = element_offset(channel, state_size);
      for (int64_t n = 0; n < state_size; ++n) {
        a[n] = -std::exp(weights.A_log.at(first_a + n));
        h[n] = row.has_initial_state ? saved_h[n] : 0.0f;
      }
      const float skip = weights.D.at(channel);
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
      }
      std::copy(h.begin(), h.end(), saved_h);
    }
  }
}

}  // namespace

void mamba_mixer(const MambaWeights& weights, const JambaConfig& config, const Matrix& x,
                 std::span<const MambaRow> rows, Matrix& out) {
  const int64_t num_tokens = x.num_rows();
  const int64_t num_channels = config.mamba_d_inner;
  const int64_t dt_rank = config.mamba_dt_rank;
  const int64_t state_size = config.mamba_d_state;
  const float eps = float(config.rms_norm_eps);

  Matrix projected;  // [num_tokens, 2*Di]: u then z
  matmul(x, weights.in_proj, projected);
  add_bias(projected, weights.in_proj_bias);

  Matrix activated(num_tokens, num_channels);  // [num_tokens, Di]
  for (const MambaRow& row : rows) causal_conv(weights, config, projected, row, activated);

  Matrix selective;  // [num_tokens, R + 2N]: dt, B, C
  matmul(activated, weights.x_proj, selective);
  Matrix dt_normed(num_tokens, dt_rank);   // [num_tokens, R]
  Matrix b_normed(num_tokens, state_size);  // [num_tokens, N]
  Matrix c_normed(num_tokens, state_size);  // [num_tokens, N]
  for (int64_t t = 0; t < num_tokens; ++t) {
    rms_norm(selective.row(t), weights.dt_norm, eps, dt_normed.row(t));
    rms_norm(selective.row(t) + dt_rank, weights.b_norm, eps, b_normed.row(t));
    rms_norm(selective.row(t) + dt_rank + state_size, weights.c_norm, eps, c_normed.row(t));
  }

  Matrix delta;  // [num_tokens, Di]
  matmul(dt_normed, weights.dt_proj, delta);
  add_bias(delta, weights.dt_proj_bias);
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t c = 0; c < num_channels; ++c) delta.row(t)[c] = softplus(delta.row(t)[c]);

  Matrix gated(num_tokens, num_channels);  // [num_tokens, Di]
  for (const MambaRow& row : rows)
    selective_scan(weights, config, activated, delta, b_normed, c_normed, projected, row, gated);

  matmul(gated, weights.out_proj, out);
  add_bias(out, weights.out_proj_bias);
}

}  // namespace jambo::cpu
