#include "engine/slot_pool.h"

#include <algorithm>

#include "core/error.h"
#include "core/names.h"

namespace jambo::engine {

namespace {

constexpr Names<SlotPolicy, 3> kSlotPolicyNames{
    {{"lowest", SlotPolicy::Lowest}, {"highest", SlotPolicy::Highest}, {"random", SlotPolicy::Random}}};

}  // namespace

SlotPolicy parse_slot_policy(const std::string& text) { return parse_named(kSlotPolicyNames, "slot policy", text); }
std::string_view name(SlotPolicy policy) { return name_of(kSlotPolicyNames, policy); }
std::vector<std::string_view> slot_policy_names() { return all_names(kSlotPolicyNames); }

namespace {

// The "less" of the free-slot heap: the std heap functions keep the greatest element on top, so
// Lowest inverts the comparison to keep the smallest id there.
struct HeapOrder {
  SlotPolicy policy;
  bool operator()(int64_t a, int64_t b) const { return policy == SlotPolicy::Lowest ? a > b : a < b; }
};

}  // namespace

SlotPool::SlotPool(int64_t num_slots, SlotPolicy policy, uint64_t seed) : policy_(policy), rng_(seed) {
  JAMBO_REQUIRE(num_slots > 0, "the state slot pool needs at least one slot, got {}", num_slots);
  owners_.assign(num_slots, kNoOwner);
  generations_.assign(num_slots, 0);
  ever_used_.assign(num_slots, false);
  free_slots_.resize(num_slots);
  for (int64_t slot = 0; slot < num_slots; ++slot) free_slots_[slot] = slot;
  if (policy_ != SlotPolicy::Random) std::make_heap(free_slots_.begin(), free_slots_.end(), HeapOrder{policy_});
}

SlotLease SlotPool::allocate(int64_t owner_id) {
  JAMBO_REQUIRE(owner_id >= 0, "sequence {}: a state slot owner needs a non-negative sequence id", owner_id);
  JAMBO_REQUIRE(can_allocate(), "sequence {}: no free state slot (all {} are in use)", owner_id, num_slots());
  if (policy_ == SlotPolicy::Random) {
    // rng_() % n rather than a distribution: std::mt19937_64's output is fixed by the standard, so a
    // seed picks the same slots with every standard library.
    std::swap(free_slots_[rng_() % free_slots_.size()], free_slots_.back());
  } else {
    std::pop_heap(free_slots_.begin(), free_slots_.end(), HeapOrder{policy_});
  }
  const int64_t slot = free_slots_.back();
  free_slots_.pop_back();

  if (ever_used_[slot]) ++num_reuses_;
  highest_used_ = std::max(highest_used_, slot);
  ever_used_[slot] = true;
  owners_[slot] = owner_id;
  return SlotLease{slot, ++generations_[slot]};
}

void SlotPool::free(const SlotLease& lease, int64_t owner_id) {
  const int64_t slot = lease.slot;
  JAMBO_REQUIRE(slot >= 0 && slot < num_slots(), "sequence {}: cannot free state slot {}: out of range [0, {})",
                owner_id, slot, num_slots());
  JAMBO_REQUIRE(owners_[slot] != kNoOwner, "sequence {}: cannot free state slot {}: it is already free (double free)",
                owner_id, slot);
  JAMBO_REQUIRE(owners_[slot] == owner_id, "sequence {}: cannot free state slot {}: it is held by sequence {}",
                owner_id, slot, owners_[slot]);
  JAMBO_REQUIRE(generations_[slot] == lease.generation,
                "sequence {}: cannot free state slot {}: its lease of generation {} is stale (current generation {})",
                owner_id, slot, lease.generation, generations_[slot]);

  owners_[slot] = kNoOwner;
  free_slots_.push_back(slot);
  if (policy_ != SlotPolicy::Random) std::push_heap(free_slots_.begin(), free_slots_.end(), HeapOrder{policy_});
}

bool SlotPool::is_held_by(const SlotLease& lease, int64_t owner_id) const {
  return lease.slot >= 0 && lease.slot < num_slots() && owners_[lease.slot] == owner_id && owner_id != kNoOwner &&
         generations_[lease.slot] == lease.generation;
}

}  // namespace jambo::engine
