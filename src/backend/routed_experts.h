// The experts each MoE layer routed each token of a step to (return_routed_experts), gathered from where the layers
// left them into the outputs of the rows that asked: a trainer replays a rollout's routing from them.
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <span>
#include <vector>

namespace jambo::backend {

// Each layer's index among the MoE layers, -1 for a dense one: where its routing lies in a StepRouting.
std::vector<int64_t> moe_layer_indices(const model::JambaConfig& config);

// A step's routing as the MoE layers leave it: layer after layer, token after token, k experts each.
struct StepRouting {
  std::span<const int32_t> experts;  // [num_moe_layers, num_tokens, k], each token's in increasing order
  int64_t num_moe_layers = 0, num_tokens = 0, k = 0;
};

// Whether any row asks for its routing.
bool any_row_wants_routing(std::span<const BatchRow> rows);

// RowOutput::routed_experts [num_tokens, num_moe_layers, k] of each row that asks (the step's tokens row after row).
void add_routed_experts(std::span<const BatchRow> rows, const StepRouting& routing, StepOutput& output);

}  // namespace jambo::backend
