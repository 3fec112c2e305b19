// Turns a step's scheduled sequences into the backend's batch rows and runs them. In checked mode
// (law 2) every row's (request, slot, generation) is verified against the slot pool before the
// backend touches the slot, freed slots are poisoned with NaN, and logits are checked to be finite,
// so a stale state read fails the step loudly instead of producing text.
#pragma once

#include "backend/backend.h"
#include "engine/scheduler.h"
#include "engine/slot_pool.h"

#include <vector>

namespace jambo {

class ModelRunner {
 public:
  ModelRunner(Backend& backend, const SlotPool& slots, bool checked);

  int64_t num_law_violations() const { return num_law_violations_; }

  // Runs the rows; throws jambo::Error naming the request and slot on a law 2 violation (checked mode).
  const StepLogits& run(const std::vector<ScheduledRow>& rows);
  // Called for every slot the scheduler frees.
  void on_slot_freed(int64_t slot);
  // Whether a row needs the logits of all its tokens: the prompt logprobs, taken once per request.
  static bool wants_all_logits(const ScheduledRow& row);

 private:
  BatchRow make_row(const ScheduledRow& scheduled) const;
  void check_owner(const Sequence& sequence);
  void check_finite(const std::vector<ScheduledRow>& rows);
  [[noreturn]] void report_violation(const Sequence& sequence, const std::string& what);

  Backend& backend_;
  const SlotPool& slots_;
  bool checked_;
  int64_t num_law_violations_ = 0;
  std::vector<BatchRow> rows_;
  StepLogits logits_;
};

}  // namespace jambo
