// Picks each step's rows under a token budget: decodes first, then the prefills already under way,
// then new (or preempted) sequences first come, first served with whatever budget is left, one token
// included. When KV blocks run out it preempts by recompute, most recently admitted first: the victim
// loses its slot, blocks and state and goes back to waiting, keeping its generated tokens.
#pragma once

#include "engine/kv_block_manager.h"
#include "engine/request.h"
#include "engine/slot_pool.h"

#include <deque>
#include <functional>
#include <vector>

namespace jambo::engine {

struct ScheduledRow {
  Sequence* sequence = nullptr;
  int64_t num_tokens = 0;  // tokens [num_computed, num_computed + num_tokens) of the sequence run this step
};

struct StepPlan {
  std::vector<ScheduledRow> rows;
  std::vector<Sequence*> admitted;
  std::vector<Sequence*> preempted;
  std::vector<Sequence*> forking;  // sample 0 of requests whose prompt completes this step (n > 1); their
                                   // other samples already hold a slot and the prompt's blocks
};

class Scheduler {
 public:
  // on_slot_freed runs for every slot given back (checked mode poisons it).
  Scheduler(int64_t max_num_batched_tokens, SlotPool& slots, KvBlockManager& kv_blocks,
            std::function<void(int64_t slot)> on_slot_freed);

  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }

  void add(Sequence& sequence);  // a new request's sample 0, to the waiting queue
  StepPlan schedule();
  // A forked sample starts running (after its slot got the prompt's state).
  void start_forked(Sequence& sequence);
  // Gives back the slot and blocks of a finished or aborted sequence and forgets it.
  void remove(Sequence& sequence);

 private:
  void start_running(Sequence& sequence);
  void schedule_running(SequenceState phase, int64_t& budget, StepPlan& plan);
  void admit_waiting(int64_t& budget, StepPlan& plan);
  void schedule_row(Sequence& sequence, int64_t num_tokens, StepPlan& plan);
  // Blocks the row needs beyond those the sequence holds (and its fork's blocks when its prompt completes).
  int64_t num_blocks_needed(const Sequence& sequence, int64_t num_tokens) const;
  // The newest-arrived running sequence after `index` not scheduled yet, or null.
  Sequence* preemption_victim(size_t index, const StepPlan& plan) const;
  void preempt(Sequence& sequence, StepPlan& plan);
  void release(Sequence& sequence);
  // Slots a waiting sequence takes when admitted: n for a request still to fork (kept for its samples).
  static int64_t num_slots_to_admit(const Sequence& sequence);

  int64_t max_num_batched_tokens_;
  SlotPool& slots_;
  KvBlockManager& kv_blocks_;
  std::function<void(int64_t)> on_slot_freed_;
  std::deque<Sequence*> waiting_;   // by (arrival, sample): first come, first served
  std::vector<Sequence*> running_;  // by (arrival, sample)
  int64_t num_reserved_slots_ = 0;  // free slots promised to the samples of running requests still to fork
  int64_t num_preemptions_ = 0;
};

}  // namespace jambo::engine
