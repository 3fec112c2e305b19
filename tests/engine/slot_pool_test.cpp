// The state slot pool (DESIGN.md law 2): each policy's order against a plain std::set, generations,
// reuse counting, and an error naming request and slot for every misuse of a lease.
#include "engine/slot_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

#include "core/error.h"

namespace jambo::engine {
namespace {

// Runs `body` and returns the jambo::Error message it throws ("" and a test failure if none).
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "no jambo::Error was thrown";
  return "";
}

std::vector<int64_t> allocate_all(SlotPool& pool, int64_t owner_id) {
  std::vector<int64_t> slots;
  while (pool.can_allocate()) slots.push_back(pool.allocate(owner_id).slot);
  return slots;
}

TEST(SlotPool, ParsesPolicyNames) {
  EXPECT_EQ(parse_slot_policy("lowest"), SlotPolicy::Lowest);
  EXPECT_EQ(parse_slot_policy("highest"), SlotPolicy::Highest);
  EXPECT_EQ(parse_slot_policy("random"), SlotPolicy::Random);
  EXPECT_NE(error_of([] { parse_slot_policy("Highest"); }).find("'Highest'"), std::string::npos);
  for (SlotPolicy policy : {SlotPolicy::Lowest, SlotPolicy::Highest, SlotPolicy::Random})
    EXPECT_EQ(parse_slot_policy(std::string(name(policy))), policy);
}

TEST(SlotPool, RejectsEmptyPool) { EXPECT_THROW(SlotPool(0, SlotPolicy::Lowest), Error); }

// Random allocations and frees; Lowest and Highest must pick the smallest / largest free id of a
// std::set kept beside the pool, and generations and reuses must match counters kept here.
void expect_matches_set_model(SlotPolicy policy) {
  const int64_t num_slots = 50;
  SlotPool pool(num_slots, policy);
  std::set<int64_t> free_ids;
  for (int64_t slot = 0; slot < num_slots; ++slot) free_ids.insert(slot);
  std::map<int64_t, SlotLease> held;  // owner -> lease
  std::map<int64_t, uint64_t> allocations_of_slot;
  int64_t expected_reuses = 0;
  std::mt19937_64 random(7);
  for (int64_t owner = 0; owner < 2000; ++owner) {
    if (!held.empty() && (free_ids.empty() || random() % 2 == 0)) {
      auto victim = std::next(held.begin(), int64_t(random() % held.size()));
      pool.free(victim->second, victim->first);
      free_ids.insert(victim->second.slot);
      held.erase(victim);
      continue;
    }
    const int64_t expected_slot = policy == SlotPolicy::Lowest ? *free_ids.begin() : *free_ids.rbegin();
    const SlotLease lease = pool.allocate(owner);
    ASSERT_EQ(lease.slot, expected_slot) << "allocation for request " << owner;
    expected_reuses += allocations_of_slot[lease.slot] > 0;
    EXPECT_EQ(lease.generation, ++allocations_of_slot[lease.slot]);
    free_ids.erase(lease.slot);
    held[owner] = lease;
    EXPECT_EQ(pool.num_used(), int64_t(held.size()));
  }
  EXPECT_EQ(pool.num_reuses(), expected_reuses);
  EXPECT_GT(expected_reuses, 100);
}

TEST(SlotPool, LowestHandsOutTheSmallestFreeId) { expect_matches_set_model(SlotPolicy::Lowest); }
TEST(SlotPool, HighestHandsOutTheLargestFreeId) { expect_matches_set_model(SlotPolicy::Highest); }

TEST(SlotPool, FreshPoolOrderPerPolicy) {
  SlotPool lowest(4, SlotPolicy::Lowest), highest(4, SlotPolicy::Highest);
  EXPECT_EQ(allocate_all(lowest, 1), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(allocate_all(highest, 1), (std::vector<int64_t>{3, 2, 1, 0}));
}

// Law 3 relies on Highest reaching the top of a big pool at once; the heap keeps that cheap.
TEST(SlotPool, HighestOrderHoldsForALargePool) {
  const int64_t num_slots = 1 << 18;
  SlotPool pool(num_slots, SlotPolicy::Highest);
  const std::vector<int64_t> slots = allocate_all(pool, 3);
  ASSERT_EQ(int64_t(slots.size()), num_slots);
  for (int64_t i = 0; i < num_slots; ++i) ASSERT_EQ(slots[i], num_slots - 1 - i);
}

TEST(SlotPool, RandomIsAPermutationReproducibleBySeed) {
  SlotPool first(64, SlotPolicy::Random, 42), again(64, SlotPolicy::Random, 42), other(64, SlotPolicy::Random, 43);
  const std::vector<int64_t> order = allocate_all(first, 1);
  EXPECT_EQ(allocate_all(again, 1), order);
  EXPECT_NE(allocate_all(other, 1), order);
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 64u);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(order, sorted);
}

TEST(SlotPool, RandomStaysReproducibleThroughFrees) {
  // Requests 0, 1, 2, ... each take a slot; when the pool is full the oldest running one leaves.
  auto slot_sequence = [](uint64_t seed) {
    SlotPool pool(8, SlotPolicy::Random, seed);
    std::vector<SlotLease> leases;  // [owner]
    std::vector<int64_t> slots;
    for (int64_t owner = 0; owner < 200; ++owner) {
      if (!pool.can_allocate()) {
        const int64_t oldest = owner - pool.num_slots();
        pool.free(leases[oldest], oldest);
      }
      leases.push_back(pool.allocate(owner));
      slots.push_back(leases.back().slot);
    }
    return slots;
  };
  EXPECT_EQ(slot_sequence(5), slot_sequence(5));
  EXPECT_NE(slot_sequence(5), slot_sequence(6));
}

// The stress summary's "top slot used": the highest slot ever handed out, kept after it is freed.
TEST(SlotPool, HighestUsedRemembersTheTopSlotEverHandedOut) {
  SlotPool lowest(8, SlotPolicy::Lowest);
  EXPECT_EQ(lowest.highest_used(), -1);
  const SlotLease first = lowest.allocate(1), second = lowest.allocate(2);
  EXPECT_EQ(lowest.highest_used(), 1);
  lowest.free(second, 2);
  lowest.free(first, 1);
  EXPECT_EQ(lowest.highest_used(), 1);
  EXPECT_EQ(lowest.allocate(3).slot, 0);  // a lower slot later does not lower it
  EXPECT_EQ(lowest.highest_used(), 1);
  SlotPool highest(8, SlotPolicy::Highest);
  highest.allocate(1);
  EXPECT_EQ(highest.highest_used(), 7);
}

TEST(SlotPool, GenerationIsBumpedPerAllocation) {
  SlotPool pool(2, SlotPolicy::Lowest);
  const SlotLease first = pool.allocate(10);
  const SlotLease other = pool.allocate(11);
  EXPECT_EQ(first.slot, 0);
  EXPECT_EQ(first.generation, 1u);
  EXPECT_EQ(other.generation, 1u);
  pool.free(first, 10);
  const SlotLease second = pool.allocate(12);
  EXPECT_EQ(second.slot, 0);
  EXPECT_EQ(second.generation, 2u);
  EXPECT_EQ(pool.num_reuses(), 1);
}

TEST(SlotPool, IsHeldByChecksOwnerSlotAndGeneration) {
  SlotPool pool(2, SlotPolicy::Lowest);
  const SlotLease lease = pool.allocate(10);
  EXPECT_TRUE(pool.is_held_by(lease, 10));
  EXPECT_FALSE(pool.is_held_by(lease, 11));
  EXPECT_FALSE(pool.is_held_by(SlotLease{lease.slot, lease.generation + 1}, 10));
  EXPECT_FALSE(pool.is_held_by(SlotLease{1, lease.generation}, 10));
  EXPECT_FALSE(pool.is_held_by(SlotLease{2, lease.generation}, 10));
  EXPECT_FALSE(pool.is_held_by(SlotLease{-1, lease.generation}, 10));
  pool.free(lease, 10);
  EXPECT_FALSE(pool.is_held_by(lease, 10));
  const SlotLease next = pool.allocate(10);  // same owner, same slot, new generation
  EXPECT_EQ(next.slot, lease.slot);
  EXPECT_FALSE(pool.is_held_by(lease, 10));
  EXPECT_TRUE(pool.is_held_by(next, 10));
}

// Every misuse names the sequence and the slot, and leaves the pool as it was.
void expect_misuse(SlotPool& pool, const SlotLease& lease, int64_t owner_id, const std::string& reason) {
  const int64_t num_free = pool.num_free();
  const std::string message = error_of([&] { pool.free(lease, owner_id); });
  EXPECT_NE(message.find(fmt::format("sequence {}", owner_id)), std::string::npos) << message;
  EXPECT_NE(message.find(fmt::format("slot {}", lease.slot)), std::string::npos) << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;
  EXPECT_EQ(pool.num_free(), num_free);
}

TEST(SlotPool, MisusesAreErrorsNamingSequenceAndSlot) {
  SlotPool pool(3, SlotPolicy::Lowest);
  const SlotLease stale = pool.allocate(7);
  pool.free(stale, 7);
  expect_misuse(pool, stale, 7, "already free");

  const SlotLease current = pool.allocate(7);  // slot 0 again, generation 2
  ASSERT_EQ(current.slot, stale.slot);
  expect_misuse(pool, stale, 7, "stale");
  expect_misuse(pool, current, 8, "held by sequence 7");
  expect_misuse(pool, SlotLease{3, 1}, 7, "out of range");
  EXPECT_TRUE(pool.is_held_by(current, 7));

  pool.allocate(8);
  pool.allocate(9);
  const std::string message = error_of([&] { pool.allocate(12); });
  EXPECT_NE(message.find("sequence 12"), std::string::npos) << message;
  EXPECT_NE(message.find("no free state slot"), std::string::npos) << message;
}

}  // namespace
}  // namespace jambo::engine
