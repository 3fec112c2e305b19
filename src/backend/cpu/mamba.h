// The Mamba mixer (spec §3.5) over the tokens of several rows, each continuing its own state.
#pragma once

#include "backend/communicator.h"
#include "backend/cpu/matrix.h"
#include "backend/state_values.h"
#include "model/config.h"
#include "model/weights.h"

#include <span>

namespace jambo::backend::cpu {

// Where a row saves its state after its first num_tokens tokens (BatchRow::checkpoints).
struct MambaCheckpoint {
  int64_t num_tokens = 0;
  StateValues conv_tail;  // [Di, K-1]
  StateValues ssm_state;  // [Di, N]
};

// One row's share of a Mamba layer: its tokens in the step and its state in the slot pool.
struct MambaRow {
  int64_t first_token = 0;  // index of the row's first token in the step's activations
  int64_t num_tokens = 0;
  bool has_initial_state = false;  // law 1: false => zero conv tail and zero h; the slot is never read
  StateValues conv_tail;           // [Di, K-1] read when has_initial_state; always rewritten
  StateValues ssm_state;           // [Di, N]   read when has_initial_state; always rewritten
  std::span<const MambaCheckpoint> checkpoints;  // by increasing num_tokens, written as the scan passes them
};

// out = Mamba(x) for every token; each row's conv tail and SSM state are carried forward. For a tensor-parallel
// rank's shard of the channels, x_proj's partial sums are summed over the ranks before dt_proj and the norms, and out
// is the rank's partial sum (model/tensor_parallel.h).
void mamba_mixer(const model::MambaWeights& weights, const model::JambaConfig& config,
                 const Matrix& x,  // [num_tokens, H] (already normalized)
                 std::span<const MambaRow> rows,
                 Matrix& out,  // [num_tokens, H]
                 Communicator* communicator = nullptr);

}  // namespace jambo::backend::cpu
