#include "engine/model_runner.h"

#include "core/error.h"

#include <cmath>

namespace jambo {

ModelRunner::ModelRunner(Backend& backend, const SlotPool& slots, bool checked)
    : backend_(backend), slots_(slots), checked_(checked) {}

bool ModelRunner::wants_all_logits(const ScheduledRow& row) {
  const Sequence& sequence = *row.sequence;
  return sequence.request.wants_prompt_logprobs() && sequence.sample == 0 && !sequence.request.prompt_computed;
}

BatchRow ModelRunner::make_row(const ScheduledRow& scheduled) const {
  const Sequence& sequence = *scheduled.sequence;
  BatchRow row;
  row.request_id = sequence.id;
  row.tokens = std::span<const int32_t>(sequence.tokens()).subspan(sequence.num_computed(), scheduled.num_tokens);
  row.start_position = sequence.num_computed();
  row.has_initial_state = sequence.has_state();  // law 1: from the state, never from the token count
  row.slot = sequence.lease->slot;
  row.block_table = sequence.block_table;
  row.all_logits = wants_all_logits(scheduled);
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
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t num_vectors = wants_all_logits(rows[r]) ? rows[r].num_tokens : 1;
    for (int64_t v = 0; v < num_vectors; ++v)
      for (float logit : logits_.row(int64_t(r), v))
        if (!std::isfinite(logit))
          report_violation(*rows[r].sequence, fmt::format("logits read from state slot {} are not finite "
                                                          "(a read of a poisoned slot)",
                                                          rows[r].sequence->lease->slot));
  }
}

const StepLogits& ModelRunner::run(const std::vector<ScheduledRow>& rows) {
  rows_.clear();
  for (const ScheduledRow& scheduled : rows) {
    if (checked_) check_owner(*scheduled.sequence);
    rows_.push_back(make_row(scheduled));
  }
  backend_.forward(rows_, logits_);
  if (checked_) check_finite(rows);
  return logits_;
}

void ModelRunner::on_slot_freed(int64_t slot) {
  if (checked_) backend_.poison_state(slot);
}

}  // namespace jambo
