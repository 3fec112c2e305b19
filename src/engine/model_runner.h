// Turns a step's scheduled sequences into the backend's batch rows and runs them. In checked mode
// (law 2) every row's (request, slot, generation) is verified against the slot pool before the
// backend touches the slot, freed slots are poisoned with NaN, and logits are checked to be finite,
// so a stale state read fails the step loudly instead of producing text. Each row asks the backend for
// what the step needs of its logits: the prompt's logprobs (taken once per request) and a token choice for
// every sample that takes its next token from the row (n samples forking off one prompt share its row).
#pragma once

#include "backend/backend.h"
#include "engine/scheduler.h"
#include "engine/slot_pool.h"

#include <vector>

namespace jambo::engine {

class ModelRunner {
 public:
  ModelRunner(backend::Backend& backend, const SlotPool& slots, int64_t kv_block_size, bool checked);

  int64_t num_law_violations() const { return num_law_violations_; }
  double forward_seconds() const { return forward_seconds_; }         // wall time inside the backend's forward, in all
  int64_t num_nonfinite_rows() const { return num_nonfinite_rows_; }  // rows whose logits were not all finite

  // Runs the rows; throws jambo::Error naming the request and slot on a law 2 violation (checked mode).
  // Row r's output holds a prompt logprob for each prompt token its tokens predict, and the token chosen
  // for each of choosers(r), in order.
  const backend::StepOutput& run(const std::vector<ScheduledRow>& rows);
  // The sequences taking their next token from row r of the last run.
  const std::vector<Sequence*>& choosers(size_t row) const { return choosers_[row]; }
  // Called for every slot the scheduler frees.
  void on_slot_freed(int64_t slot);

 private:
  backend::BatchRow make_row(const ScheduledRow& scheduled, size_t row_index);
  void check_owner(const Sequence& sequence);
  void check_finite(const std::vector<ScheduledRow>& rows);
  [[noreturn]] void report_violation(const Sequence& sequence, const std::string& what);

  backend::Backend& backend_;
  const SlotPool& slots_;
  int64_t kv_block_size_;
  bool checked_;
  int64_t num_law_violations_ = 0;
  double forward_seconds_ = 0.0;
  int64_t num_nonfinite_rows_ = 0;
  std::vector<backend::BatchRow> rows_;
  std::vector<std::vector<int32_t>> targets_;      // [rows] prompt tokens each row's vectors predict
  std::vector<std::vector<Sequence*>> choosers_;   // [rows]
  std::vector<std::vector<backend::TokenChoice>> choices_;  // [rows] one per chooser
  backend::StepOutput output_;
};

}  // namespace jambo::engine
