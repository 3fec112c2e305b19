#include "engine/model_runner.h"

#include "core/error.h"

#include <algorithm>
#include <chrono>

namespace jambo::engine {

ModelRunner::ModelRunner(backend::Backend& backend, const SlotPool& slots, int64_t kv_block_size, bool checked)
    : backend_(backend), slots_(slots), kv_block_size_(kv_block_size), checked_(checked) {}

namespace {

// The prompt tokens that the row's logits vectors predict (vector i predicts token start + i + 1), once
// per request: sample 0 computes the prompt for all samples.
std::vector<int32_t> prompt_targets(const ScheduledRow& scheduled) {
  const Sequence& sequence = *scheduled.sequence;
  const Request& request = sequence.request;
  if (!request.wants_prompt_logprobs() || sequence.sample != 0 || request.prompt_computed) return {};
  const std::vector<int32_t>& prompt = request.spec.prompt_ids;
  const int64_t first = sequence.num_computed() + 1;
  const int64_t end = std::min(first + scheduled.num_tokens, request.num_prompt_tokens());
  return first < end ? std::vector<int32_t>(prompt.begin() + first, prompt.begin() + end) : std::vector<int32_t>{};
}

// The sequences that take their next token from this row: none while prompt chunks remain; all samples
// when the row ends the prompt of a request that forks into n samples.
std::vector<Sequence*> row_choosers(const ScheduledRow& scheduled) {
  Sequence& sequence = *scheduled.sequence;
  if (scheduled.num_tokens < sequence.num_uncomputed()) return {};
  if (!sequence.leads_fork()) return {&sequence};
  std::vector<Sequence*> choosers;
  for (const auto& sample : sequence.request.samples) choosers.push_back(sample.get());
  return choosers;
}

}  // namespace

backend::BatchRow ModelRunner::make_row(const ScheduledRow& scheduled, size_t row_index) {
  const Sequence& sequence = *scheduled.sequence;
  targets_[row_index] = prompt_targets(scheduled);
  choosers_[row_index] = row_choosers(scheduled);
  choices_[row_index].clear();
  for (Sequence* chooser : choosers_[row_index]) choices_[row_index].push_back(chooser->sampler.next_choice());
  // Law 1: the row's initial state is the sequence's (has_state: some of it ran), never a guess from token counts.
  JAMBO_ASSERT(sequence.has_state() == (sequence.num_computed() > 0));
  backend::BatchRow row =
      backend::sequence_row(sequence.id, sequence.tokens(), sequence.num_computed(), scheduled.num_tokens,
                            sequence.lease->slot, sequence.block_table, kv_block_size_);
  row.targets = targets_[row_index];
  row.num_top_logprobs = sequence.request.spec.num_prompt_logprobs.value_or(0);
  row.choices = choices_[row_index];
  row.routed_experts = sequence.request.spec.return_routed_experts;
  row.checkpoints = scheduled.checkpoints;
  return row;
}

void ModelRunner::report_violation(const Sequence& sequence, const std::string& what) {
  ++num_law_violations_;
  fail("law 2 violation: request '{}' sample {} (sequence {}): {}", sequence.request.spec.id, sequence.sample,
       sequence.id, what);
}

void ModelRunner::check_owner(const Sequence& sequence) {
  const SlotLease& lease = *sequence.lease;
  if (!slots_.is_held_by(lease, sequence.id))
    report_violation(sequence,
                     fmt::format("state slot {} generation {} is not held by it", lease.slot, lease.generation));
}

void ModelRunner::check_finite(const std::vector<ScheduledRow>& rows) {
  for (size_t r = 0; r < rows.size(); ++r)
    if (!output_.rows[r].finite)
      report_violation(*rows[r].sequence, fmt::format("logits read from state slot {} are not finite "
                                                      "(a read of a poisoned slot)",
                                                      rows[r].sequence->lease->slot));
}

const backend::StepOutput& ModelRunner::run(const std::vector<ScheduledRow>& rows) {
  rows_.clear();
  targets_.resize(rows.size());
  choosers_.resize(rows.size());
  choices_.resize(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    if (checked_) check_owner(*rows[r].sequence);
    rows_.push_back(make_row(rows[r], r));
  }
  const auto start = std::chrono::steady_clock::now();
  backend_.forward(rows_, output_);
  forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const backend::RowOutput& row : output_.rows) num_nonfinite_rows_ += !row.finite;
  if (checked_) check_finite(rows);
  return output_;
}

void ModelRunner::on_slot_freed(int64_t slot) {
  if (checked_) backend_.poison_state(slot);
}

}  // namespace jambo::engine
