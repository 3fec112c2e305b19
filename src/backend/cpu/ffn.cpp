#include "backend/cpu/ffn.h"

#include "backend/cpu/matmul.h"
#include "backend/cpu/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace jambo::cpu {
namespace {

struct Route {
  int64_t token;
  float weight;
};

// Softmax over all experts in fp32, in index order.
std::vector<float> expert_probabilities(const float* logits, int64_t num_experts) {
  const float max_logit = *std::max_element(logits, logits + num_experts);
  std::vector<float> probabilities(static_cast<size_t>(num_experts));
  float total = 0.0f;
  for (int64_t e = 0; e < num_experts; ++e) {
    probabilities[e] = std::exp(logits[e] - max_logit);
    total += probabilities[e];
  }
  for (float& probability : probabilities) probability /= total;
  return probabilities;
}

// routes[e] lists the tokens sent to expert e with their weights, tokens in increasing order.
std::vector<std::vector<Route>> route_tokens(const Matrix& router_logits,  // [num_tokens, E]
                                             int64_t num_experts_per_tok) {
  const int64_t num_experts = router_logits.num_cols();
  std::vector<std::vector<Route>> routes(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < router_logits.num_rows(); ++t) {
    std::vector<float> probabilities = expert_probabilities(router_logits.row(t), num_experts);
    std::vector<bool> chosen(size_t(num_experts), false);
    for (int64_t pick = 0; pick < num_experts_per_tok; ++pick) {
      int64_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e)
        if (!chosen[e] && (best < 0 || probabilities[e] > probabilities[best])) best = e;
      chosen[best] = true;
      routes[best].push_back({t, probabilities[best]});
    }
  }
  return routes;
}

}  // namespace

void dense_mlp(const MlpWeights& weights, const Matrix& x, Matrix& out) {
  Matrix gate, up;  // [num_tokens, I]
  matmul(x, weights.gate_proj, gate);
  matmul(x, weights.up_proj, up);
  const int64_t count = gate.num_rows() * gate.num_cols();
  for (int64_t i = 0; i < count; ++i) gate.data()[i] = silu(gate.data()[i]) * up.data()[i];
  matmul(gate, weights.down_proj, out);
}

void sparse_moe(const MoeWeights& weights, int64_t num_experts_per_tok, const Matrix& x, Matrix& out) {
  Matrix router_logits;  // [num_tokens, E]
  matmul(x, weights.router, router_logits);
  const std::vector<std::vector<Route>> routes = route_tokens(router_logits, num_experts_per_tok);

  out = Matrix(x.num_rows(), x.num_cols());
  const int64_t hidden_size = x.num_cols();
  for (size_t expert = 0; expert < routes.size(); ++expert) {
    const std::vector<Route>& routed = routes[expert];
    if (routed.empty()) continue;
    Matrix expert_input(int64_t(routed.size()), hidden_size);  // [num_routed, H]
    for (size_t i = 0; i < routed.size(); ++i)
      std::copy_n(x.row(routed[i].token), hidden_size, expert_input.row(int64_t(i)));
    Matrix expert_output;  // [num_routed, H]
    dense_mlp(weights.experts[expert], expert_input, expert_output);
    for (size_t i = 0; i < routed.size(); ++i) {
      float* target = out.row(routed[i].token);
      const float* source = expert_output.row(int64_t(i));
      for (int64_t d = 0; d < hidden_size; ++d) target[d] += routed[i].weight * source[d];
    }
  }
}

}  // namespace jambo::cpu
