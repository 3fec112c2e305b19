// The recurrent-state slot pool (DESIGN.md law 2): which request owns each backend state slot, and
// under which generation. A slot's generation changes every time it is handed out, so a row that
// names (slot, generation) can be checked against the current owner before the backend touches it.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace jambo::engine {

enum class SlotPolicy { Lowest, Highest, Random };

// Parses "lowest", "highest" or "random"; throws jambo::Error naming the value otherwise.
SlotPolicy parse_slot_policy(const std::string& text);
std::string_view name(SlotPolicy policy);  // "lowest", "highest" or "random"
std::vector<std::string_view> slot_policy_names();

struct SlotLease {
  int64_t slot = -1;
  uint64_t generation = 0;
};

class SlotPool {
 public:
  SlotPool(int64_t num_slots, SlotPolicy policy, uint64_t seed = 0);

  int64_t num_slots() const { return int64_t(owners_.size()); }
  int64_t num_free() const { return int64_t(free_slots_.size()); }
  int64_t num_used() const { return num_slots() - num_free(); }
  int64_t num_reuses() const { return num_reuses_; }  // allocations of a slot that was used before
  int64_t highest_used() const { return highest_used_; }  // the highest slot ever handed out (-1: none)

  bool can_allocate(int64_t count = 1) const { return num_free() >= count; }
  // Hands a free slot (chosen by the policy) to owner_id; throws when none is free.
  SlotLease allocate(int64_t owner_id);
  // Returns the slot; throws (naming request and slot) unless owner_id holds this exact lease.
  void free(const SlotLease& lease, int64_t owner_id);
  // Law 2: whether owner_id holds this lease now (the slot is in use, by it, at this generation).
  bool is_held_by(const SlotLease& lease, int64_t owner_id) const;

 private:
  static constexpr int64_t kNoOwner = -1;
  SlotPolicy policy_;
  std::vector<int64_t> owners_;        // [num_slots] owner request id or kNoOwner
  std::vector<uint64_t> generations_;  // [num_slots] bumped at every allocation
  std::vector<bool> ever_used_;        // [num_slots]
  // The free slot ids: a heap whose top (front) is the next slot for Lowest and Highest, so each
  // allocation and free costs O(log n); in no particular order for Random.
  std::vector<int64_t> free_slots_;
  int64_t num_reuses_ = 0;
  int64_t highest_used_ = -1;
  std::mt19937_64 rng_;
};

}  // namespace jambo::engine
