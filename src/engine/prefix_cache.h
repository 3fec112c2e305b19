// Automatic prefix caching for a hybrid model. A transformer resumes a prompt from cached KV blocks; Jamba also needs
// its Mamba layers' recurrent state at the exact token where the cached prefix ends, a summary of everything before
// it. So the cache holds two things per block boundary of the prompts it has seen:
//   - the KV block of the block that ends there (shared by reference count with the sequences that use it);
//   - optionally, a checkpoint of the recurrent state there (conv tails and SSM states), in a checkpoint slot that a
//     row wrote from inside its step (BatchRow::checkpoints).
// A new sequence resumes from the deepest boundary where a checkpoint and every KV block before it are cached: its
// own slot gets a copy of the checkpoint (it never runs in one), and its block table the shared blocks.
//
// Entries form a tree, one per block of tokens under its parent's, found by a hash of the block's tokens under the
// parent and then compared token by token: a hash collision can never serve another prefix's state. A change of
// the weights empties the cache (the engine clears it). Checkpoints carry an owner (their entry) and a generation like state slots (law 2),
// and an evicted one goes through on_checkpoint_freed (checked mode poisons it). Checkpoints are saved at a prompt's
// last block boundary and at the boundary where a prompt leaves a cached prefix (a branch point: the next request
// with that prefix finds a checkpoint there), and past the prompt at the last block boundary a sequence reached (one
// per sequence, the latest: a next chat turn sends the output back); least recently used entries go first, KV blocks
// from the leaves.
#pragma once

#include "engine/kv_block_manager.h"
#include "engine/slot_pool.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace jambo::engine {

// Why a query found nothing to resume from (counted per query).
enum class PrefixMiss { NoCheckpoint, Evicted, BelowOneBlock, WeightVersion };
inline constexpr int kNumPrefixMisses = 4;
std::string_view name(PrefixMiss miss);  // "no_checkpoint", "evicted", "below_one_block", "weight_version"

// A checkpoint slot as the cache lends it: the lease, its owner (one per reservation) and the backend's slot index.
struct CheckpointLease {
  int64_t owner = -1;
  SlotLease lease;     // lease.slot indexes the checkpoint pool
  int64_t backend_slot = -1;
};

// What a query found.
struct PrefixMatch {
  int64_t num_tokens = 0;                       // tokens to resume past (0: a miss)
  std::vector<int32_t> kv_blocks;               // [num_tokens / block_size] cached blocks holding them
  std::optional<CheckpointLease> checkpoint;    // the state after them (models with Mamba layers)
  std::optional<PrefixMiss> miss;               // why nothing, where num_tokens is 0
  std::vector<int64_t> boundaries_to_save;      // where this sequence's prefill should save checkpoints
  std::vector<int64_t> entries;                 // the cached blocks the prompt begins with (touched when counted)
};

struct PrefixCacheCounters {
  int64_t query_tokens = 0;  // prompt tokens of the sequences that asked
  int64_t hit_tokens = 0;    // of those, the tokens resumed past
  int64_t misses[kNumPrefixMisses] = {};
  int64_t checkpoints_used = 0, checkpoints_total = 0;
  int64_t checkpoint_evictions = 0;
  int64_t cached_kv_blocks = 0;  // KV blocks the cache holds (some also held by sequences)
  int64_t kv_blocks_only_cached = 0;  // of those, held by no sequence: free to evict
  int64_t kv_block_evictions = 0;
};

class PrefixCache {
 public:
  // Checkpoint c is the backend's slot first_checkpoint_slot + c. The model may lack attention layers (no KV blocks
  // are cached) or Mamba layers (no checkpoint is needed).
  PrefixCache(int64_t block_size, bool has_attention, bool has_mamba, KvBlockManager& kv_blocks,
              int64_t num_checkpoints, int64_t first_checkpoint_slot,
              std::function<void(int64_t backend_slot)> on_checkpoint_freed);

  // The deepest cached prefix of tokens[0, max_tokens) to resume from, and the boundaries of the prompt (its first
  // num_prompt_tokens tokens) to save at. Changes nothing and takes no reference: the caller shares the blocks,
  // copies the checkpoint before anything can evict them, and counts the query once it is admitted.
  PrefixMatch match(std::span<const int32_t> tokens, int64_t num_prompt_tokens, int64_t max_tokens) const;
  // The query of an admitted sequence: the counters, and its cached blocks as the most recently used.
  void count(const PrefixMatch& match, int64_t num_prompt_tokens);

  // A checkpoint slot for the state after tokens[0, boundary), evicting the least recently used checkpoint when none
  // is free; none where every checkpoint is being written this step. Held by the caller until insert() or
  // release_checkpoint().
  std::optional<CheckpointLease> reserve_checkpoint();
  void release_checkpoint(const CheckpointLease& checkpoint);
  // Drops the checkpoint after tokens[0, num_tokens) where it is still this one (not evicted, nor the cache emptied).
  void drop_checkpoint(std::span<const int32_t> tokens, int64_t num_tokens, const CheckpointLease& checkpoint);
  // Whether this lease still holds its checkpoint (law 2, checked before a copy out of it).
  bool holds(const CheckpointLease& checkpoint) const;
  // The stale-checkpoint fault (stress --inject): a checkpoint the cache holds but not the state after the match,
  // the deepest of a shorter prefix of the same prompt (one block short where saved), else the most recently used
  // of another prefix; the match's own where the cache holds no other.
  CheckpointLease stale_checkpoint(const PrefixMatch& match) const;

  // After a step computed tokens[0, num_tokens) of a sequence: its full blocks up to num_tokens enter the cache
  // (block_table[i] holds block i; the cache takes a reference), and the checkpoint, if any, becomes the state after
  // the last of them (num_tokens a multiple of the block size). Entries already there are kept, a duplicate
  // checkpoint released.
  void insert(std::span<const int32_t> tokens, int64_t num_tokens, std::span<const int32_t> block_table,
              std::optional<CheckpointLease> checkpoint);

  // Frees KV blocks that only the cache holds, least recently used leaves first, until num_blocks are free or none
  // is left to evict; returns whether num_blocks are free.
  bool make_free_blocks(int64_t num_blocks);

  // Empties the cache (reset, a weight update, a sleep): every reference dropped, every checkpoint freed. A later
  // miss on a first block cached before is counted under later_misses_are (weight_version, evicted), where given.
  void clear(std::optional<PrefixMiss> later_misses_are = std::nullopt);

  PrefixCacheCounters counters() const;
  int64_t num_checkpoints() const { return checkpoints_ ? checkpoints_->num_slots() : 0; }

 private:
  struct Entry {
    int64_t parent = -1;            // -1: the root (the first block)
    std::vector<int32_t> tokens;    // [block_size] this block's tokens
    int32_t kv_block = -1;          // held by the cache (-1: a model without attention layers)
    std::optional<CheckpointLease> checkpoint;
    bool checkpoint_evicted = false;
    int64_t num_children = 0;
    uint64_t last_used = 0;
  };

  static uint64_t key(int64_t parent, std::span<const int32_t> block_tokens);
  // Takes an entry out of the eviction orders (leaves_, checkpointed_) before a change to its place in them, and
  // files it back after.
  void unlist(int64_t id);
  void list(int64_t id);
  // The child of parent holding these tokens, or -1.
  int64_t find_child(int64_t parent, std::span<const int32_t> block_tokens) const;
  int64_t add_entry(int64_t parent, std::span<const int32_t> block_tokens, int32_t kv_block);
  void touch(int64_t id);
  void drop_checkpoint(int64_t id, bool evicted);
  // Removes a leaf entry, its KV block reference and its checkpoint; `evicted` remembers its key for the counters.
  void erase(int64_t id, bool evicted);
  // Removes entries that hold nothing and lead nowhere, from id up (a model without attention layers keeps no
  // entry but those on the way to a checkpoint).
  void prune(int64_t id);

  int64_t block_size_;
  bool has_attention_, has_mamba_;
  KvBlockManager& kv_blocks_;
  std::optional<SlotPool> checkpoints_;  // none where num_checkpoints is 0; owners: CheckpointLease::entry
  int64_t first_checkpoint_slot_;
  std::function<void(int64_t)> on_checkpoint_freed_;
  std::unordered_map<int64_t, Entry> entries_;
  std::unordered_multimap<uint64_t, int64_t> index_;  // key(parent, tokens) -> entry ids
  // (last_used, id), least recently used first: the entries without children (KV blocks are evicted from them), and
  // those holding a checkpoint.
  std::set<std::pair<uint64_t, int64_t>> leaves_, checkpointed_;
  std::unordered_set<uint64_t> evicted_keys_;         // keys of entries evicted (a later miss there is "evicted")
  std::unordered_set<uint64_t> stale_keys_;           // first blocks cached under earlier weights
  int64_t next_id_ = 0;     // entry ids
  int64_t next_owner_ = 0;  // checkpoint owners
  uint64_t clock_ = 0;
  PrefixCacheCounters counters_;
};

}  // namespace jambo::engine
