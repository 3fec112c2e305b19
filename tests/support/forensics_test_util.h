// What the forensics tests of both backends (tests/forensics, tests/backend/cuda) run: sequences for the batched reference
// and a small stress run.
#pragma once

#include "support/sequences.h"
#include "support/engine_test_util.h"
#include "forensics/stress.h"

namespace jambo::testing {

// Lengths 0 and 1 (nothing to score), 2 (a one-token row from zero state, in a slot a longer row used before it
// when steps are small), and some longer than a 48-token step budget.
inline std::vector<std::vector<int32_t>> mixed_reference_sequences(int64_t vocab_size) {
  const std::vector<int64_t> lengths = {2, 40, 1, 2, 130, 17, 0, 2, 9, 33, 49, 5, 2, 64, 3, 25, 2, 80, 2, 11};
  std::vector<std::vector<int32_t>> sequences;
  for (size_t i = 0; i < lengths.size(); ++i) sequences.push_back(random_tokens(lengths[i], vocab_size, 100 + i));
  return sequences;
}

// 40 requests (prompts 1..40 tokens, 1..6 new tokens, n 1..3) over state slots for n + 2 sequences and KV blocks
// for one largest request, an 8-token step budget (one-token admissions, preemption) and slot policy highest;
// engine and reference on one backend.
inline forensics::StressResult run_small_stress(const model::Model& model, const engine::EngineFaults& faults,
                                                engine::BackendKind backend = engine::BackendKind::Cpu,
                                                int64_t num_shared_prefixes = 0) {
  forensics::StressWorkload workload;
  workload.num_requests = 40;
  workload.max_prompt_tokens = 40;
  workload.max_new_tokens = 6;
  workload.max_samples = 3;
  workload.seed = 11;
  workload.num_shared_prefixes = num_shared_prefixes;
  const int64_t max_model_len = workload.max_prompt_tokens + workload.max_new_tokens;
  const int64_t kv_block_size = 16;
  engine::EngineOptions options = exact_engine_options(
      model, /*max_num_seqs=*/workload.max_samples + 2,
      /*num_kv_blocks=*/workload.max_samples * backend::kv_blocks_for(max_model_len, kv_block_size), kv_block_size,
      max_model_len, backend);
  options.checked = false;  // an injected bug must reach the logprobs, not stop at a poisoned slot
  options.max_num_batched_tokens = 8;
  options.slot_policy = engine::SlotPolicy::Highest;
  options.faults = faults;
  // A pool of 3 checkpoints beside the slots and blocks, so that the cache evicts constantly, and prompts in chunks of
  // 32 tokens, so that a prefix is in the cache before most requests that share it arrive.
  if (num_shared_prefixes > 0) {
    options.max_num_batched_tokens = 32;
    options.max_num_checkpoints = 3;
    options.memory_budget.bytes += 3 * engine::state_elements_per_slot(model.config) * int64_t(sizeof(float));
  }
  forensics::ReferenceOptions reference;
  reference.backend = backend;
  return run_stress(model, nullptr, options, workload, forensics::kDefaultCompareThreshold, reference);
}

}  // namespace jambo::testing
