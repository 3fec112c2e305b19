#include "engine/prefix_cache.h"

#include "core/error.h"
#include "core/names.h"

#include <algorithm>

namespace jambo::engine {

namespace {

constexpr Names<PrefixMiss, kNumPrefixMisses> kMissNames{{{"no_checkpoint", PrefixMiss::NoCheckpoint},
                                                          {"evicted", PrefixMiss::Evicted},
                                                          {"below_one_block", PrefixMiss::BelowOneBlock},
                                                          {"weight_version", PrefixMiss::WeightVersion}}};

// The keys of evicted entries are remembered for the miss counters only; past this many they are forgotten.
constexpr size_t kMaxRememberedKeys = size_t(1) << 20;

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::string_view name(PrefixMiss miss) { return name_of(kMissNames, miss); }

PrefixCache::PrefixCache(int64_t block_size, bool has_attention, bool has_mamba, KvBlockManager& kv_blocks,
                         int64_t num_checkpoints, int64_t first_checkpoint_slot,
                         std::function<void(int64_t backend_slot)> on_checkpoint_freed)
    : block_size_(block_size),
      has_attention_(has_attention),
      has_mamba_(has_mamba),
      kv_blocks_(kv_blocks),
      first_checkpoint_slot_(first_checkpoint_slot),
      on_checkpoint_freed_(std::move(on_checkpoint_freed)) {
  JAMBO_REQUIRE(block_size > 0, "the prefix cache's block size must be positive, got {}", block_size);
  JAMBO_REQUIRE(num_checkpoints >= 0, "the number of prefix checkpoints must not be negative, got {}",
                num_checkpoints);
  if (num_checkpoints > 0) checkpoints_.emplace(num_checkpoints, SlotPolicy::Lowest);
}

uint64_t PrefixCache::key(int64_t parent, std::span<const int32_t> block_tokens) {
  uint64_t hash = mix(uint64_t(parent) + 0x9e3779b97f4a7c15ull);
  for (int32_t token : block_tokens) hash = mix(hash ^ uint32_t(token));
  return hash;
}

int64_t PrefixCache::find_child(int64_t parent, std::span<const int32_t> block_tokens) const {
  const auto [first, last] = index_.equal_range(key(parent, block_tokens));
  for (auto it = first; it != last; ++it) {
    const Entry& entry = entries_.at(it->second);
    if (entry.parent == parent && std::equal(entry.tokens.begin(), entry.tokens.end(), block_tokens.begin(),
                                             block_tokens.end()))
      return it->second;
  }
  return -1;
}

void PrefixCache::unlist(int64_t id) {
  const Entry& entry = entries_.at(id);
  leaves_.erase({entry.last_used, id});
  checkpointed_.erase({entry.last_used, id});
}

void PrefixCache::list(int64_t id) {
  const Entry& entry = entries_.at(id);
  if (entry.num_children == 0) leaves_.insert({entry.last_used, id});
  if (entry.checkpoint) checkpointed_.insert({entry.last_used, id});
}

void PrefixCache::touch(int64_t id) {
  unlist(id);
  entries_.at(id).last_used = ++clock_;
  list(id);
}

PrefixMatch PrefixCache::match(std::span<const int32_t> tokens, int64_t num_prompt_tokens, int64_t max_tokens) const {
  PrefixMatch match;
  const int64_t num_prompt_blocks = std::min<int64_t>(num_prompt_tokens, int64_t(tokens.size())) / block_size_;
  // The chain of cached blocks the prompt begins with, and where its deepest usable checkpoint is.
  std::vector<int64_t>& chain = match.entries;
  bool saw_eviction = false;
  int64_t hit_blocks = 0;
  for (int64_t b = 0; b < num_prompt_blocks; ++b) {
    const std::span<const int32_t> block = tokens.subspan(size_t(b * block_size_), size_t(block_size_));
    const int64_t parent = chain.empty() ? -1 : chain.back();
    const int64_t child = find_child(parent, block);
    if (child < 0) {
      saw_eviction = saw_eviction || evicted_keys_.contains(key(parent, block));
      break;
    }
    chain.push_back(child);
    const Entry& entry = entries_.at(child);
    saw_eviction = saw_eviction || entry.checkpoint_evicted;
    if ((b + 1) * block_size_ <= max_tokens && (entry.checkpoint || !has_mamba_)) hit_blocks = b + 1;
  }

  match.num_tokens = hit_blocks * block_size_;
  if (hit_blocks > 0) {
    for (int64_t b = 0; b < hit_blocks && has_attention_; ++b)
      match.kv_blocks.push_back(entries_.at(chain[b]).kv_block);
    match.checkpoint = entries_.at(chain[hit_blocks - 1]).checkpoint;
  } else if (max_tokens < block_size_) {
    match.miss = PrefixMiss::BelowOneBlock;
  } else if (stale_keys_.contains(key(-1, tokens.first(size_t(block_size_))))) {
    match.miss = PrefixMiss::WeightVersion;
  } else {
    match.miss = saw_eviction ? PrefixMiss::Evicted : PrefixMiss::NoCheckpoint;
  }

  if (!has_mamba_) return match;
  // Checkpoints to save: where the prompt leaves the cached prefix, and at its last block boundary.
  const auto has_checkpoint_at = [&](int64_t num_blocks) {
    return num_blocks <= int64_t(chain.size()) && entries_.at(chain[num_blocks - 1]).checkpoint.has_value();
  };
  const int64_t branch_blocks = int64_t(chain.size());
  if (branch_blocks > hit_blocks && branch_blocks < num_prompt_blocks && !has_checkpoint_at(branch_blocks))
    match.boundaries_to_save.push_back(branch_blocks * block_size_);
  if (num_prompt_blocks > hit_blocks && !has_checkpoint_at(num_prompt_blocks))
    match.boundaries_to_save.push_back(num_prompt_blocks * block_size_);
  return match;
}

void PrefixCache::count(const PrefixMatch& match, int64_t num_prompt_tokens) {
  counters_.query_tokens += num_prompt_tokens;
  counters_.hit_tokens += match.num_tokens;
  if (match.miss) ++counters_.misses[int(*match.miss)];
  for (int64_t id : match.entries)
    if (entries_.contains(id)) touch(id);  // making room for the sequence may have evicted those past its hit
}

std::optional<CheckpointLease> PrefixCache::reserve_checkpoint() {
  if (!checkpoints_) return std::nullopt;
  if (!checkpoints_->can_allocate()) {
    if (checkpointed_.empty()) return std::nullopt;  // every checkpoint is being written this step
    drop_checkpoint(checkpointed_.begin()->second, /*evicted=*/true);
  }
  const int64_t owner = next_owner_++;
  const SlotLease lease = checkpoints_->allocate(owner);
  return CheckpointLease{owner, lease, first_checkpoint_slot_ + lease.slot};
}

void PrefixCache::release_checkpoint(const CheckpointLease& checkpoint) {
  JAMBO_REQUIRE(checkpoints_, "a checkpoint is released but the prefix cache has none");
  checkpoints_->free(checkpoint.lease, checkpoint.owner);
  on_checkpoint_freed_(checkpoint.backend_slot);
}

void PrefixCache::drop_checkpoint(std::span<const int32_t> tokens, int64_t num_tokens,
                                  const CheckpointLease& checkpoint) {
  int64_t id = -1;
  for (int64_t b = 0; b < num_tokens / block_size_; ++b) {
    id = find_child(id, tokens.subspan(size_t(b * block_size_), size_t(block_size_)));
    if (id < 0) return;
  }
  if (id < 0) return;
  const std::optional<CheckpointLease>& held = entries_.at(id).checkpoint;
  if (held && held->owner == checkpoint.owner && held->lease.generation == checkpoint.lease.generation)
    drop_checkpoint(id, /*evicted=*/false);
}

bool PrefixCache::holds(const CheckpointLease& checkpoint) const {
  return checkpoints_ && checkpoints_->is_held_by(checkpoint.lease, checkpoint.owner) &&
         checkpoint.backend_slot == first_checkpoint_slot_ + checkpoint.lease.slot;
}

CheckpointLease PrefixCache::stale_checkpoint(const PrefixMatch& match) const {
  JAMBO_ASSERT(match.checkpoint && match.num_tokens > 0);
  for (int64_t b = match.num_tokens / block_size_ - 1; b-- > 0;)
    if (const std::optional<CheckpointLease>& shorter = entries_.at(match.entries[size_t(b)]).checkpoint)
      return *shorter;
  for (auto use = checkpointed_.rbegin(); use != checkpointed_.rend(); ++use) {
    const CheckpointLease& other = *entries_.at(use->second).checkpoint;
    if (other.owner != match.checkpoint->owner) return other;
  }
  return *match.checkpoint;
}

int64_t PrefixCache::add_entry(int64_t parent, std::span<const int32_t> block_tokens, int32_t kv_block) {
  const int64_t id = next_id_++;
  Entry entry;
  entry.parent = parent;
  entry.tokens.assign(block_tokens.begin(), block_tokens.end());
  if (has_attention_) {
    kv_blocks_.hold(kv_block);
    entry.kv_block = kv_block;
    ++counters_.cached_kv_blocks;
  }
  const uint64_t entry_key = key(parent, block_tokens);
  entry.last_used = ++clock_;
  entries_.emplace(id, std::move(entry));
  index_.emplace(entry_key, id);
  evicted_keys_.erase(entry_key);
  list(id);
  if (parent >= 0) {
    unlist(parent);
    ++entries_.at(parent).num_children;
    list(parent);
  }
  return id;
}

void PrefixCache::insert(std::span<const int32_t> tokens, int64_t num_tokens, std::span<const int32_t> block_table,
                         std::optional<CheckpointLease> checkpoint) {
  const int64_t num_blocks = num_tokens / block_size_;
  JAMBO_ASSERT(num_tokens <= int64_t(tokens.size()) && (!has_attention_ || num_blocks <= int64_t(block_table.size())));
  JAMBO_ASSERT(!checkpoint || (num_blocks > 0 && num_tokens % block_size_ == 0));
  int64_t parent = -1;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const std::span<const int32_t> block = tokens.subspan(size_t(b * block_size_), size_t(block_size_));
    int64_t id = find_child(parent, block);
    if (id < 0) id = add_entry(parent, block, has_attention_ ? block_table[b] : -1);
    touch(id);
    parent = id;
  }
  if (checkpoint) {
    Entry& entry = entries_.at(parent);
    if (entry.checkpoint) {
      release_checkpoint(*checkpoint);  // another sequence saved the same state first
    } else {
      unlist(parent);
      entry.checkpoint = checkpoint;
      entry.checkpoint_evicted = false;
      list(parent);
    }
  }
  if (parent >= 0) prune(parent);
}

void PrefixCache::drop_checkpoint(int64_t id, bool evicted) {
  Entry& entry = entries_.at(id);
  unlist(id);
  release_checkpoint(*entry.checkpoint);
  entry.checkpoint.reset();
  list(id);
  if (evicted) {
    entry.checkpoint_evicted = true;
    ++counters_.checkpoint_evictions;
  }
  prune(id);
}

void PrefixCache::erase(int64_t id, bool evicted) {
  Entry& entry = entries_.at(id);
  JAMBO_ASSERT(entry.num_children == 0);
  if (entry.kv_block >= 0) {
    kv_blocks_.release(entry.kv_block);
    --counters_.cached_kv_blocks;
    if (evicted) ++counters_.kv_block_evictions;
  }
  if (entry.checkpoint) {
    release_checkpoint(*entry.checkpoint);
    if (evicted) ++counters_.checkpoint_evictions;
  }
  const uint64_t entry_key = key(entry.parent, entry.tokens);
  const auto [first, last] = index_.equal_range(entry_key);
  for (auto it = first; it != last; ++it)
    if (it->second == id) {
      index_.erase(it);
      break;
    }
  if (evicted) {
    if (evicted_keys_.size() >= kMaxRememberedKeys) evicted_keys_.clear();
    evicted_keys_.insert(entry_key);
  }
  unlist(id);
  if (entry.parent >= 0) {
    unlist(entry.parent);
    --entries_.at(entry.parent).num_children;
    list(entry.parent);
  }
  entries_.erase(id);
}

void PrefixCache::prune(int64_t id) {
  while (id >= 0 && !has_attention_) {
    const Entry& entry = entries_.at(id);
    if (entry.num_children > 0 || entry.checkpoint) return;
    const int64_t parent = entry.parent;
    erase(id, /*evicted=*/false);
    id = parent;
  }
}

bool PrefixCache::make_free_blocks(int64_t num_blocks) {
  while (kv_blocks_.num_free() < num_blocks) {
    const auto leaf = std::find_if(leaves_.begin(), leaves_.end(), [&](const auto& use) {
      const Entry& entry = entries_.at(use.second);
      return entry.kv_block >= 0 && kv_blocks_.num_holders(entry.kv_block) == 1;
    });
    if (leaf == leaves_.end()) return false;
    erase(leaf->second, /*evicted=*/true);
  }
  return true;
}

void PrefixCache::clear(std::optional<PrefixMiss> later_misses_are) {
  std::unordered_set<uint64_t> first_keys;
  for (const auto& [id, entry] : entries_)
    if (entry.parent < 0) first_keys.insert(key(-1, entry.tokens));
  // Leaves first, so that each entry erased has no children left.
  std::vector<int64_t> ids;
  for (const auto& [id, entry] : entries_) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), std::greater<>());  // children are added after their parents
  for (int64_t id : ids) erase(id, /*evicted=*/false);
  evicted_keys_.clear();
  stale_keys_.clear();
  if (later_misses_are == PrefixMiss::WeightVersion) stale_keys_ = std::move(first_keys);
  if (later_misses_are == PrefixMiss::Evicted) evicted_keys_ = std::move(first_keys);
}

PrefixCacheCounters PrefixCache::counters() const {
  PrefixCacheCounters counters = counters_;
  counters.checkpoints_total = num_checkpoints();
  counters.checkpoints_used = checkpoints_ ? checkpoints_->num_used() : 0;
  for (const auto& [id, entry] : entries_)
    counters.kv_blocks_only_cached += entry.kv_block >= 0 && kv_blocks_.num_holders(entry.kv_block) == 1;
  return counters;
}

}  // namespace jambo::engine
