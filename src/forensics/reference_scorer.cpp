#include "forensics/reference_scorer.h"

#include "backend/nonfinite_logits.h"
#include "engine/backend_factory.h"
#include "core/error.h"

#include <algorithm>
#include <numeric>

namespace jambo::forensics {
namespace {

// Enough slots and KV blocks for the largest step: row r of a step takes slot r, and the KV blocks after
// those of the rows before it.
backend::CacheConfig reference_cache(std::span<const std::vector<int32_t>> sequences,
                                     std::span<const ReferenceStep> steps) {
  backend::CacheConfig cache;
  for (const ReferenceStep& step : steps) {
    int64_t num_rows = 0, num_blocks = 0;
    for (size_t i = step.first; i < step.first + step.count; ++i) {
      const int64_t num_tokens = reference_row_tokens(sequences[i].size());
      if (num_tokens == 0) continue;
      ++num_rows;
      num_blocks += backend::kv_blocks_for(num_tokens, cache.kv_block_size);
    }
    cache.num_state_slots = std::max(cache.num_state_slots, num_rows);
    cache.num_kv_blocks = std::max(cache.num_kv_blocks, num_blocks);
  }
  return cache;
}

bool has_rows(std::span<const std::vector<int32_t>> sequences) {
  return std::any_of(sequences.begin(), sequences.end(),
                     [](const std::vector<int32_t>& sequence) { return reference_row_tokens(sequence.size()) > 0; });
}

// Runs one step and stores each row's target logprobs as its sequence's; `name` names a row's sequence in errors.
void score_step(backend::Backend& backend, const backend::CacheConfig& cache,
                std::span<const std::vector<int32_t>> sequences, const ReferenceStep& step,
                std::span<const int32_t> all_blocks, backend::StepOutput& output,
                std::vector<std::vector<double>>& logprobs, const std::function<std::string(size_t row)>& name) {
  std::vector<backend::BatchRow> rows;
  std::vector<size_t> row_sequence;  // [rows] index of each row's sequence
  int64_t next_block = 0;
  for (size_t i = step.first; i < step.first + step.count; ++i) {
    const std::span<const int32_t> sequence = sequences[i];
    const int64_t num_tokens = reference_row_tokens(sequence.size());
    if (num_tokens == 0) continue;
    const int64_t num_blocks = backend::kv_blocks_for(num_tokens, cache.kv_block_size);
    // From zero state (position 0), whatever the slot held before.
    backend::BatchRow row =
        backend::sequence_row(int64_t(i), sequence, 0, num_tokens, int64_t(rows.size()),
                              all_blocks.subspan(size_t(next_block), size_t(num_blocks)), cache.kv_block_size);
    row.targets = sequence.subspan(1);  // the logits at position t predict token t + 1
    next_block += num_blocks;
    rows.push_back(row);
    row_sequence.push_back(i);
  }
  if (rows.empty()) return;
  backend.forward(rows, output);
  backend::require_finite_logits(output, [&](size_t r) { return name(row_sequence[r]); });
  for (size_t r = 0; r < rows.size(); ++r) logprobs[row_sequence[r]] = std::move(output.rows[r].target_logprobs);
}

}  // namespace

int64_t reference_row_tokens(size_t sequence_length) { return sequence_length < 2 ? 0 : int64_t(sequence_length) - 1; }

std::vector<ReferenceStep> plan_reference_steps(std::span<const std::vector<int32_t>> sequences,
                                                int64_t max_step_tokens, int64_t max_step_rows) {
  JAMBO_REQUIRE(max_step_tokens >= 1, "the reference's tokens per step must be >= 1, got {}", max_step_tokens);
  JAMBO_REQUIRE(max_step_rows >= 1, "the reference's rows per step must be >= 1, got {}", max_step_rows);
  std::vector<ReferenceStep> steps;
  int64_t step_tokens = 0, step_rows = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t num_tokens = reference_row_tokens(sequences[i].size());
    const bool full = step_rows == max_step_rows || step_tokens + num_tokens > max_step_tokens;
    if (steps.empty() || (num_tokens > 0 && step_rows > 0 && full)) {
      steps.push_back({i, 0});
      step_tokens = step_rows = 0;
    }
    ++steps.back().count;
    if (num_tokens == 0) continue;
    step_tokens += num_tokens;
    ++step_rows;
  }
  return steps;
}

std::vector<std::vector<double>> score_sequences(const model::Model& model,
                                                 std::span<const std::vector<int32_t>> sequences,
                                                 const ReferenceOptions& options,
                                                 const std::function<void(int64_t, int64_t)>& on_progress,
                                                 const std::function<std::string(size_t)>& name_of) {
  const std::vector<ReferenceStep> steps =
      plan_reference_steps(sequences, options.max_step_tokens, options.max_step_rows);
  std::vector<std::vector<double>> logprobs(sequences.size());
  if (!has_rows(sequences)) return logprobs;  // no backend needed

  const backend::CacheConfig cache = reference_cache(sequences, steps);
  const engine::BackendChoice choice{.kind = options.backend,
                                     .cuda_weights = options.cuda_weights,
                                     .cuda_gemm = options.cuda_gemm,
                                     .tensor_parallel_size = options.tensor_parallel_size};
  const std::unique_ptr<backend::Backend> backend = engine::make_backend(choice, model, cache);
  std::vector<int32_t> all_blocks(size_t(cache.num_kv_blocks));  // [num_kv_blocks] 0, 1, 2, ...
  std::iota(all_blocks.begin(), all_blocks.end(), 0);
  backend::StepOutput output;
  const int64_t total = int64_t(sequences.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    const ReferenceStep& step = steps[s];
    const auto name = [&](size_t i) {
      return fmt::format("{}, reference step {}", name_of ? name_of(i) : fmt::format("sequence {}", i), s);
    };
    score_step(*backend, cache, sequences, step, all_blocks, output, logprobs, name);
    if (on_progress) on_progress(int64_t(step.first + step.count), total);
  }
  return logprobs;
}

}  // namespace jambo::forensics
