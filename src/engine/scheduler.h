// Picks each step's rows under a token budget: decodes first, then the prefills already under way,
// then new (or preempted) sequences first come, first served with whatever budget is left, one token
// included. When KV blocks run out it preempts by recompute, most recently admitted first: the victim
// loses its slot, blocks and state and goes back to waiting, keeping its generated tokens.
#pragma once

#include "backend/backend.h"
#include "engine/kv_block_manager.h"
#include "engine/prefix_cache.h"
#include "engine/request.h"
#include "engine/slot_pool.h"

#include <deque>
#include <functional>
#include <vector>

namespace jambo::engine {

struct ScheduledRow {
  Sequence* sequence = nullptr;
  int64_t num_tokens = 0;  // tokens [num_computed, num_computed + num_tokens) of the sequence run this step
  std::vector<backend::StateCheckpoint> checkpoints;  // the prefix cache's, set before the run
  std::vector<CheckpointLease> checkpoint_leases;     // [checkpoints]
};

struct StepPlan {
  std::vector<ScheduledRow> rows;
  std::vector<Sequence*> admitted;
  std::vector<Sequence*> preempted;
  std::vector<Sequence*> forking;  // sample 0 of requests whose prompt completes this step (n > 1); their
                                   // other samples already hold a slot and the prompt's blocks
};

// A sequence admitted from a cached prefix: its slot is to get the checkpoint's state before it runs.
using PrefixHitListener = std::function<void(Sequence& sequence, const PrefixMatch& match)>;

class Scheduler {
 public:
  // on_slot_freed runs for every slot given back (checked mode poisons it). With a prefix cache, a sequence admitted
  // without state resumes from its deepest cached prefix (on_prefix_hit copies the checkpoint at once, before a
  // later admission can evict it), and KV blocks that only the cache holds are freed before anything is preempted.
  Scheduler(int64_t max_num_batched_tokens, SlotPool& slots, KvBlockManager& kv_blocks,
            std::function<void(int64_t slot)> on_slot_freed, PrefixCache* prefix_cache = nullptr,
            PrefixHitListener on_prefix_hit = nullptr);

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
  // Whether num_blocks KV blocks are free, after evicting cached blocks that no sequence holds where needed.
  bool make_room(int64_t num_blocks);
  // The cached prefix a sequence about to be admitted resumes from (none without a cache, or for a request that
  // asks for its prompt's logprobs: those need every prompt token's logits).
  PrefixMatch match_prefix(const Sequence& sequence) const;
  void schedule_row(Sequence& sequence, int64_t num_tokens, StepPlan& plan);
  // Blocks the row needs beyond those the sequence holds (and its fork's blocks when its prompt completes).
  int64_t num_blocks_needed(const Sequence& sequence, int64_t num_tokens) const;
  int64_t num_blocks_needed(const Sequence& sequence, int64_t num_computed, int64_t num_tokens) const;
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
  PrefixCache* prefix_cache_;
  PrefixHitListener on_prefix_hit_;
  std::deque<Sequence*> waiting_;   // by (arrival, sample): first come, first served
  std::vector<Sequence*> running_;  // by (arrival, sample)
  int64_t num_reserved_slots_ = 0;  // free slots promised to the samples of running requests still to fork
  int64_t num_preemptions_ = 0;
};

}  // namespace jambo::engine
