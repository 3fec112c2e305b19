#include "backend/cpu/ffn.h"

#include "backend/cpu/gemm.h"
#include "backend/cpu/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace jambo::backend::cpu {
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

void dense_mlp(const model::MlpWeights& weights, const Matrix& x, Matrix& out) {
  // Kept from call to call (per thread) to reuse their storage; used through references, because a
  // thread_local named inside a lambda run by a worker would be the worker's own.
  thread_local Matrix kept_gate, kept_up;
  Matrix& gate = kept_gate;  // [num_tokens, I]
  Matrix& up = kept_up;      // [num_tokens, I]
  matmul(x, weights.gate_proj, gate);
  matmul(x, weights.up_proj, up);
  const int64_t num_cols = gate.num_cols();
  parallel_for(gate.num_rows(), num_cols, [&](int64_t t) {
    float* gate_row = gate.row(t);
    const float* up_row = up.row(t);
    for (int64_t i = 0; i < num_cols; ++i) gate_row[i] = silu(gate_row[i]) * up_row[i];
  });
  matmul(gate, weights.down_proj, out);
}

void sparse_moe(const model::MoeWeights& weights, int64_t num_experts_per_tok, const Matrix& x, Matrix& out,
                int32_t* experts) {
  // Kept from call to call (per thread) to reuse their storage; used through references, as in dense_mlp.
  thread_local Matrix router_logits;  // [num_tokens, E]
  thread_local Matrix kept_input, kept_output;
  Matrix& expert_input = kept_input;    // [num_routed, H]
  Matrix& expert_output = kept_output;  // [num_routed, H]
  matmul(x, weights.router, router_logits);
  const std::vector<std::vector<Route>> routes = route_tokens(router_logits, num_experts_per_tok);
  if (experts != nullptr) {  // expert after expert, so each token's come in increasing order
    std::vector<int64_t> num_filled(size_t(x.num_rows()), 0);
    for (size_t expert = 0; expert < routes.size(); ++expert)
      for (const Route& route : routes[expert])
        experts[route.token * num_experts_per_tok + num_filled[route.token]++] = int32_t(expert);
  }

  out.resize(x.num_rows(), x.num_cols());  // the experts' shares are added into zeros
  std::fill_n(out.data(), x.num_rows() * x.num_cols(), 0.0f);
  const int64_t hidden_size = x.num_cols();
  for (size_t expert = 0; expert < routes.size(); ++expert) {
    const std::vector<Route>& routed = routes[expert];
    if (routed.empty()) continue;
    const int64_t num_routed = int64_t(routed.size());
    expert_input.resize(num_routed, hidden_size);
    parallel_for(num_routed, hidden_size, [&](int64_t i) {
      std::copy_n(x.row(routed[i].token), hidden_size, expert_input.row(i));
    });
    dense_mlp(weights.experts[expert], expert_input, expert_output);
    // A token appears once per expert, so the rows can be added in parallel; the experts stay in order.
    parallel_for(num_routed, hidden_size, [&](int64_t i) {
      float* target = out.row(routed[i].token);
      const float* source = expert_output.row(i);
      for (int64_t d = 0; d < hidden_size; ++d) target[d] += routed[i].weight * source[d];
    });
  }
}

}  // namespace jambo::backend::cpu
