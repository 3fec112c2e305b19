#include "naive_reference.h"

#include <algorithm>
#include <cmath>

namespace jambo::naive {
namespace {

double silu(double a) { return a / (1.0 + std::exp(-a)); }
double softplus(double a) { return a > 20.0 ? a : std::log1p(std::exp(a)); }

Rows zeros(size_t num_tokens, int64_t width) { return Rows(num_tokens, std::vector<double>(size_t(width), 0.0)); }

// Columns [first, first + count) of every row.
Rows columns(const Rows& x, int64_t first, int64_t count) {
  Rows out;
  for (const auto& row : x) out.emplace_back(row.begin() + first, row.begin() + first + count);
  return out;
}

void add(Rows& y, const Rows& x) {
  for (size_t t = 0; t < y.size(); ++t)
    for (size_t i = 0; i < y[t].size(); ++i) y[t][i] += x[t][i];
}

}  // namespace

Rows linear(const Rows& x, const TensorView& weight, const TensorView& bias) {
  const int64_t out_features = weight.rows(), in_features = weight.cols();
  Rows y = zeros(x.size(), out_features);
  for (size_t t = 0; t < x.size(); ++t) {
    for (int64_t o = 0; o < out_features; ++o) {
      double sum = bias.empty() ? 0.0 : bias.at(o);
      for (int64_t i = 0; i < in_features; ++i) sum += x[t][i] * weight.at(o * in_features + i);
      y[t][o] = sum;
    }
  }
  return y;
}

Rows rms_norm(const Rows& x, const TensorView& weight, double eps) {
  Rows y = x;
  for (auto& row : y) {
    double mean_square = 0.0;
    for (double v : row) mean_square += v * v / double(row.size());
    for (size_t i = 0; i < row.size(); ++i) row[i] = weight.at(int64_t(i)) * row[i] / std::sqrt(mean_square + eps);
  }
  return y;
}

Rows mamba(const model::MambaWeights& w, const model::JambaConfig& config, const Rows& x) {
  const int64_t Di = config.mamba_d_inner, K = config.mamba_d_conv, N = config.mamba_d_state;
  const int64_t R = config.mamba_dt_rank;
  const size_t T = x.size();
  const Rows projected = linear(x, w.in_proj, w.in_proj_bias);
  const Rows u = columns(projected, 0, Di), z = columns(projected, Di, Di);

  Rows activated = zeros(T, Di);  // causal conv with zero padding on the left, then SiLU
  for (size_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < Di; ++c) {
      double sum = w.conv_bias.empty() ? 0.0 : w.conv_bias.at(c);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t source = int64_t(t) - (K - 1) + j;
        if (source >= 0) sum += w.conv_weight.at(c * K + j) * u[source][c];
      }
      activated[t][c] = silu(sum);
    }
  }

  const Rows selective = linear(activated, w.x_proj);
  const Rows dt = rms_norm(columns(selective, 0, R), w.dt_norm, config.rms_norm_eps);
  const Rows b = rms_norm(columns(selective, R, N), w.b_norm, config.rms_norm_eps);
  const Rows c = rms_norm(columns(selective, R + N, N), w.c_norm, config.rms_norm_eps);
  Rows delta = linear(dt, w.dt_proj, w.dt_proj_bias);
  for (auto& row : delta)
    for (double& v : row) v = softplus(v);

  Rows gated = zeros(T, Di);
  Rows h = zeros(size_t(Di), N);
  for (size_t t = 0; t < T; ++t) {
    for (int64_t ch = 0; ch < Di; ++ch) {
      double y = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double a = -std::exp(double(w.A_log.at(ch * N + n)));
        h[ch][n] = std::exp(delta[t][ch] * a) * h[ch][n] + delta[t][ch] * b[t][n] * activated[t][ch];
        y += h[ch][n] * c[t][n];
      }
      gated[t][ch] = (y + w.D.at(ch) * activated[t][ch]) * silu(z[t][ch]);
    }
  }
  return linear(gated, w.out_proj, w.out_proj_bias);
}

Rows attention(const model::AttentionWeights& w, const model::JambaConfig& config, const Rows& x) {
  const int64_t nh = config.num_attention_heads, hd = config.head_dim;
  const int64_t group = nh / config.num_key_value_heads;
  const Rows q = linear(x, w.q_proj), k = linear(x, w.k_proj), v = linear(x, w.v_proj);
  Rows context = zeros(x.size(), nh * hd);
  for (size_t t = 0; t < x.size(); ++t) {
    for (int64_t head = 0; head < nh; ++head) {
      const int64_t kv_head = head / group;
      std::vector<double> scores;
      for (size_t j = 0; j <= t; ++j) {
        double score = 0.0;
        for (int64_t d = 0; d < hd; ++d) score += q[t][head * hd + d] * k[j][kv_head * hd + d];
        scores.push_back(score / std::sqrt(double(hd)));
      }
      const double max_score = *std::max_element(scores.begin(), scores.end());
      double total = 0.0;
      for (double& s : scores) total += (s = std::exp(s - max_score));
      for (size_t j = 0; j <= t; ++j)
        for (int64_t d = 0; d < hd; ++d) context[t][head * hd + d] += scores[j] / total * v[j][kv_head * hd + d];
    }
  }
  return linear(context, w.o_proj);
}

Rows mlp(const model::MlpWeights& w, const Rows& x) {
  Rows gate = linear(x, w.gate_proj);
  const Rows up = linear(x, w.up_proj);
  for (size_t t = 0; t < gate.size(); ++t)
    for (size_t i = 0; i < gate[t].size(); ++i) gate[t][i] = silu(gate[t][i]) * up[t][i];
  return linear(gate, w.down_proj);
}

Rows moe(const model::MoeWeights& w, int64_t num_experts_per_tok, const Rows& x) {
  const Rows logits = linear(x, w.router);
  Rows out = zeros(x.size(), int64_t(x[0].size()));
  for (size_t t = 0; t < x.size(); ++t) {
    std::vector<double> p = logits[t];
    const double max_logit = *std::max_element(p.begin(), p.end());
    double total = 0.0;
    for (double& v : p) total += (v = std::exp(v - max_logit));
    for (double& v : p) v /= total;
    std::vector<size_t> order(p.size());
    for (size_t e = 0; e < order.size(); ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    for (int64_t pick = 0; pick < num_experts_per_tok; ++pick) {
      const size_t expert = order[size_t(pick)];
      const Rows expert_out = mlp(w.experts[expert], Rows{x[t]});
      for (size_t i = 0; i < out[t].size(); ++i) out[t][i] += p[expert] * expert_out[0][i];
    }
  }
  return out;
}

Rows forward(const model::Model& model, const std::vector<int32_t>& tokens) {
  const model::JambaConfig& config = model.config;
  const model::ModelWeights& weights = model.weights;
  const int64_t H = config.hidden_size;
  Rows hidden = zeros(tokens.size(), H);
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int64_t i = 0; i < H; ++i) hidden[t][i] = weights.embed_tokens.at(tokens[t] * H + i);

  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const model::LayerWeights& lw = weights.layers[size_t(layer)];
    const Rows normed = rms_norm(hidden, lw.input_norm, config.rms_norm_eps);
    add(hidden, config.mixer_kinds[size_t(layer)] == model::MixerKind::Attention
                    ? attention(lw.attention, config, normed)
                    : mamba(lw.mamba, config, normed));
    const Rows ff_input = rms_norm(hidden, lw.pre_ff_norm, config.rms_norm_eps);
    add(hidden, config.ffn_kinds[size_t(layer)] == model::FfnKind::Moe
                    ? moe(lw.moe, config.num_experts_per_tok, ff_input)
                    : mlp(lw.mlp, ff_input));
  }
  return linear(rms_norm(hidden, weights.final_norm, config.rms_norm_eps), weights.lm_head);
}

}  // namespace jambo::naive
