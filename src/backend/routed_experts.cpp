#include "backend/routed_experts.h"

#include "core/error.h"

#include <algorithm>

namespace jambo::backend {

std::vector<int64_t> moe_layer_indices(const model::JambaConfig& config) {
  std::vector<int64_t> indices;
  int64_t num_moe = 0;
  for (model::FfnKind kind : config.ffn_kinds) indices.push_back(kind == model::FfnKind::Moe ? num_moe++ : -1);
  return indices;
}

bool any_row_wants_routing(std::span<const BatchRow> rows) {
  return std::any_of(rows.begin(), rows.end(), [](const BatchRow& row) { return row.routed_experts; });
}

void add_routed_experts(std::span<const BatchRow> rows, const StepRouting& routing, StepOutput& output) {
  JAMBO_ASSERT(output.rows.size() == rows.size());
  JAMBO_ASSERT(int64_t(routing.experts.size()) == routing.num_moe_layers * routing.num_tokens * routing.k);
  int64_t first_token = 0;  // the row's first token in the step
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t end_token = first_token + int64_t(rows[r].tokens.size());
    if (rows[r].routed_experts) {
      std::vector<int32_t>& out = output.rows[r].routed_experts;
      out.clear();
      for (int64_t t = first_token; t < end_token; ++t)
        for (int64_t layer = 0; layer < routing.num_moe_layers; ++layer) {
          const auto first = routing.experts.begin() + (layer * routing.num_tokens + t) * routing.k;
          out.insert(out.end(), first, first + routing.k);
        }
    }
    first_token = end_token;
  }
}

}  // namespace jambo::backend
