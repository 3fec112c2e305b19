// The reference path of `jambo compare` and `jambo stress`, batched. Each sequence is its own row of a
// step: a one-shot prefill from zero state (law 1: its slot is never read) of the whole sequence, in a
// slot and KV blocks no other row of the step touches, asking the backend for the logprob of each next
// token. No chunking, no preemption, nothing shared between rows: on the CPU backend (bitwise batch
// invariant, laws 4 and 5) a row's logprobs equal the sequence scored alone, and many rows per step make
// re-scoring 10^5 samples on a GPU a matter of minutes.
#pragma once

#include "engine/backend_factory.h"
#include "model/weights.h"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace jambo::forensics {

struct ReferenceOptions {
  engine::BackendKind backend = engine::BackendKind::Cpu;       // no state dtype: the reference keeps an fp32 state
  engine::CudaWeights cuda_weights = engine::CudaWeights::F32;  // within 1e-4 of the CPU
  engine::CudaGemm cuda_gemm = engine::CudaGemm::Invariant;     // bitwise: the engine's own order
  int64_t tensor_parallel_size = 1;  // ranks the model is split over: the engine's gives the engine's bits
  int64_t max_step_tokens = 8192;               // tokens of one step; a longer sequence gets a step alone
  int64_t max_step_rows = 256;                  // sequences of one step, i.e. the state slots the backend holds
};

// A step of the reference: sequences [first, first + count) of the input, each with a row of its own
// (a sequence of fewer than two tokens has nothing to score and no row).
struct ReferenceStep {
  size_t first = 0;
  size_t count = 0;
};

// The tokens a sequence's row feeds: all but the last, whose logits no target needs.
int64_t reference_row_tokens(size_t sequence_length);

// Packs the sequences, in input order, into steps of at most max_step_tokens row tokens and max_step_rows
// rows; a sequence longer than max_step_tokens gets a step alone.
std::vector<ReferenceStep> plan_reference_steps(std::span<const std::vector<int32_t>> sequences,
                                                int64_t max_step_tokens, int64_t max_step_rows);

// Scores every sequence through a fresh backend of `options` holding the slots and KV blocks of the
// largest step. logprobs[i][t] = log p(sequences[i][t + 1] | sequences[i][0..t]), so logprobs[i] has
// size - 1 entries (none for a sequence of fewer than two tokens). on_progress(done, total) is called
// after each step with the sequences finished so far. Throws backend::NonFiniteLogits when a sequence's logits are
// not finite, naming it by name_of(i) ("sequence i" without it) and the reference step.
std::vector<std::vector<double>> score_sequences(const model::Model& model,
                                                 std::span<const std::vector<int32_t>> sequences,
                                                 const ReferenceOptions& options,
                                                 const std::function<void(int64_t, int64_t)>& on_progress = {},
                                                 const std::function<std::string(size_t)>& name_of = {});

}  // namespace jambo::forensics
