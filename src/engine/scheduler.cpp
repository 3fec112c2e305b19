#include "engine/scheduler.h"

#include "core/error.h"

#include <algorithm>

namespace jambo::engine {

Scheduler::Scheduler(int64_t max_num_batched_tokens, SlotPool& slots, KvBlockManager& kv_blocks,
                     std::function<void(int64_t slot)> on_slot_freed, PrefixCache* prefix_cache,
                     PrefixHitListener on_prefix_hit)
    : max_num_batched_tokens_(max_num_batched_tokens),
      slots_(slots),
      kv_blocks_(kv_blocks),
      on_slot_freed_(std::move(on_slot_freed)),
      prefix_cache_(prefix_cache),
      on_prefix_hit_(std::move(on_prefix_hit)) {}

namespace {

bool arrived_before(const Sequence* a, const Sequence* b) {
  return std::pair(a->request.arrival, a->sample) < std::pair(b->request.arrival, b->sample);
}

bool is_scheduled(const Sequence* sequence, const StepPlan& plan) {
  return std::any_of(plan.rows.begin(), plan.rows.end(),
                     [&](const ScheduledRow& row) { return row.sequence == sequence; });
}

}  // namespace

void Scheduler::add(Sequence& sequence) {
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), &sequence, arrived_before), &sequence);
}

int64_t Scheduler::num_slots_to_admit(const Sequence& sequence) {
  return sequence.leads_fork() ? sequence.request.spec.n : 1;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = max_num_batched_tokens_;
  schedule_running(SequenceState::Decoding, budget, plan);
  schedule_running(SequenceState::Prefilling, budget, plan);
  // Admitting right after a preemption would only take back the memory just freed.
  if (plan.preempted.empty()) admit_waiting(budget, plan);
  return plan;
}

void Scheduler::schedule_running(SequenceState phase, int64_t& budget, StepPlan& plan) {
  size_t index = 0;
  while (index < running_.size() && budget > 0) {
    Sequence& sequence = *running_[index];
    if (sequence.state() != phase || is_scheduled(&sequence, plan)) {
      ++index;
      continue;
    }
    const int64_t num_tokens = std::min(sequence.num_uncomputed(), budget);
    bool preempted_itself = false;
    while (!make_room(num_blocks_needed(sequence, num_tokens))) {
      Sequence* victim = preemption_victim(index, plan);
      preempted_itself = victim == nullptr;
      preempt(victim ? *victim : sequence, plan);
      if (preempted_itself) break;
    }
    if (preempted_itself) continue;  // running_[index] is now the next sequence
    schedule_row(sequence, num_tokens, plan);
    budget -= num_tokens;
    ++index;
  }
}

// A sequence resuming from a cached prefix holds its blocks before room is made for the rest, so that making room
// cannot evict them.
void Scheduler::admit_waiting(int64_t& budget, StepPlan& plan) {
  while (!waiting_.empty() && budget > 0) {
    Sequence& sequence = *waiting_.front();
    const int64_t num_slots = num_slots_to_admit(sequence);
    if (slots_.num_free() - num_reserved_slots_ < num_slots) break;
    PrefixMatch match = match_prefix(sequence);
    kv_blocks_.share(match.kv_blocks, int64_t(match.kv_blocks.size()), sequence.block_table);
    const int64_t num_tokens = std::min(int64_t(sequence.tokens().size()) - match.num_tokens, budget);
    if (!make_room(num_blocks_needed(sequence, match.num_tokens, num_tokens))) {
      kv_blocks_.free(sequence.block_table);
      break;
    }
    waiting_.pop_front();
    if (prefix_cache_ && !sequence.request.wants_prompt_logprobs())
      prefix_cache_->count(match, sequence.request.num_prompt_tokens());
    sequence.admit(slots_.allocate(sequence.id), match.num_tokens, match.boundaries_to_save);
    if (match.num_tokens > 0) on_prefix_hit_(sequence, match);
    num_reserved_slots_ += num_slots - 1;
    start_running(sequence);
    plan.admitted.push_back(&sequence);
    schedule_row(sequence, num_tokens, plan);
    budget -= num_tokens;
  }
}

bool Scheduler::make_room(int64_t num_blocks) {
  return kv_blocks_.num_free() >= num_blocks || (prefix_cache_ && prefix_cache_->make_free_blocks(num_blocks));
}

PrefixMatch Scheduler::match_prefix(const Sequence& sequence) const {
  if (!prefix_cache_ || sequence.request.wants_prompt_logprobs()) return {};
  // The last token runs in any case: its logits choose the next token.
  return prefix_cache_->match(sequence.tokens(), sequence.request.num_prompt_tokens(),
                              int64_t(sequence.tokens().size()) - 1);
}

int64_t Scheduler::num_blocks_needed(const Sequence& sequence, int64_t num_tokens) const {
  return num_blocks_needed(sequence, sequence.num_computed(), num_tokens);
}

int64_t Scheduler::num_blocks_needed(const Sequence& sequence, int64_t num_computed, int64_t num_tokens) const {
  const int64_t end = num_computed + num_tokens;
  int64_t needed = std::max<int64_t>(0, kv_blocks_.blocks_for(end) - int64_t(sequence.block_table.size()));
  if (sequence.leads_fork() && end == sequence.request.num_prompt_tokens())  // the samples' own partial blocks
    needed += (sequence.request.spec.n - 1) * (kv_blocks_.blocks_for(end) - kv_blocks_.full_blocks(end));
  return needed;
}

void Scheduler::schedule_row(Sequence& sequence, int64_t num_tokens, StepPlan& plan) {
  const int64_t end = sequence.num_computed() + num_tokens;
  kv_blocks_.grow(sequence.block_table, end);
  plan.rows.push_back({&sequence, num_tokens, {}, {}});
  if (!sequence.leads_fork() || end != sequence.request.num_prompt_tokens()) return;
  // The prompt completes: the other samples take their reserved slots now, share the prompt's full KV blocks and
  // take a block of their own for its partial last one, and get its state after the step.
  for (size_t s = 1; s < sequence.request.samples.size(); ++s) {
    Sequence& sample = *sequence.request.samples[s];
    sample.start_from_fork(slots_.allocate(sample.id), end);
    kv_blocks_.share(sequence.block_table, kv_blocks_.full_blocks(end), sample.block_table);
    kv_blocks_.grow(sample.block_table, end);
  }
  num_reserved_slots_ -= sequence.request.spec.n - 1;
  plan.forking.push_back(&sequence);
}

Sequence* Scheduler::preemption_victim(size_t index, const StepPlan& plan) const {
  for (size_t i = running_.size(); i-- > index + 1;)
    if (!is_scheduled(running_[i], plan)) return running_[i];
  return nullptr;
}

void Scheduler::preempt(Sequence& sequence, StepPlan& plan) {
  release(sequence);
  sequence.preempt();
  add(sequence);
  plan.preempted.push_back(&sequence);
  ++num_preemptions_;
}

void Scheduler::start_forked(Sequence& sequence) { start_running(sequence); }

// Running sequences stay in arrival order, so the preemption victim is the newest request, also when an
// old request was preempted and admitted again (else it would be the victim again and again).
void Scheduler::start_running(Sequence& sequence) {
  running_.insert(std::upper_bound(running_.begin(), running_.end(), &sequence, arrived_before), &sequence);
}

void Scheduler::remove(Sequence& sequence) {
  release(sequence);
  std::erase(waiting_, &sequence);
}

void Scheduler::release(Sequence& sequence) {
  std::erase(running_, &sequence);
  kv_blocks_.free(sequence.block_table);
  if (!sequence.lease) return;
  // The other samples' slots stay reserved until they take them, when the last prompt chunk is scheduled; a request
  // that fails in that step ends after they took them.
  if (sequence.leads_fork() && !sequence.request.samples[1]->lease) num_reserved_slots_ -= sequence.request.spec.n - 1;
  slots_.free(*sequence.lease, sequence.id);
  on_slot_freed_(sequence.lease->slot);
}

}  // namespace jambo::engine
