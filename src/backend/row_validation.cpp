#include "backend/row_validation.h"

#include "backend/logits_ops.h"
#include "backend/state_values.h"
#include "core/error.h"

#include <algorithm>
#include <bitset>
#include <set>
#include <utility>
#include <vector>

namespace jambo::backend {
namespace {

// What the row asks back: targets within the step and the vocabulary, choices in range.
void validate_outputs(const BatchRow& row, int64_t vocab_size) {
  const int64_t id = row.sequence_id;
  JAMBO_REQUIRE(row.targets.size() <= row.tokens.size(), "sequence {}: {} targets for a step of {} tokens", id,
                row.targets.size(), row.tokens.size());
  for (int32_t target : row.targets)
    JAMBO_REQUIRE(target >= 0 && target < vocab_size, "sequence {}: target {} is outside the vocabulary [0, {})", id,
                  target, vocab_size);
  JAMBO_REQUIRE(row.num_top_logprobs >= 0, "sequence {}: num_top_logprobs must be >= 0, got {}", id,
                row.num_top_logprobs);
  for (const TokenChoice& choice : row.choices) {
    try {
      validate_choice(choice);
    } catch (const Error& error) {
      fail("sequence {}: {}", id, error.what());
    }
  }
}

void validate_row(const BatchRow& row, const model::JambaConfig& config, const CacheExtent& extent) {
  const int64_t id = row.sequence_id;
  const int64_t vocab_size = config.vocab_size;
  JAMBO_REQUIRE(!row.tokens.empty(), "sequence {}: a step row needs at least one token", id);
  for (int32_t token : row.tokens)
    JAMBO_REQUIRE(token >= 0 && token < vocab_size, "sequence {}: token {} is outside the vocabulary [0, {})", id,
                  token, vocab_size);
  JAMBO_REQUIRE(row.start_position >= 0, "sequence {}: negative start position {}", id, row.start_position);
  // Law 1: a zero state can only start a sequence, and a sequence can only start from zero.
  JAMBO_REQUIRE(row.has_initial_state == (row.start_position > 0),
                "sequence {}: has_initial_state is {} at start position {} (state exists iff start > 0)", id,
                row.has_initial_state, row.start_position);
  JAMBO_REQUIRE(row.slot >= 0 && row.slot < extent.num_state_slots,
                "sequence {}: state slot {} is out of range [0, {})", id, row.slot, extent.num_state_slots);
  validate_outputs(row, vocab_size);
  int64_t previous = 0;
  for (const StateCheckpoint& checkpoint : row.checkpoints) {
    JAMBO_REQUIRE(checkpoint.num_tokens > previous && checkpoint.num_tokens <= int64_t(row.tokens.size()),
                  "sequence {}: a checkpoint after {} tokens of a step of {} (after {} before it)", id,
                  checkpoint.num_tokens, row.tokens.size(), previous);
    JAMBO_REQUIRE(checkpoint.slot >= extent.num_state_slots &&
                      checkpoint.slot < extent.num_state_slots + extent.num_checkpoints,
                  "sequence {}: checkpoint slot {} is out of range [{}, {})", id, checkpoint.slot,
                  extent.num_state_slots, extent.num_state_slots + extent.num_checkpoints);
    previous = checkpoint.num_tokens;
  }
}

// The logical blocks [first, end) that hold the row's positions of this step, those it writes into; the row reads
// blocks [0, end).
std::pair<int64_t, int64_t> written_blocks(const BatchRow& row, int64_t block_size) {
  const int64_t end_position = row.start_position + int64_t(row.tokens.size());
  return {row.start_position / block_size, kv_blocks_for(end_position, block_size)};
}

void validate_block_table(const BatchRow& row, const CacheExtent& extent) {
  const int64_t id = row.sequence_id;
  const int64_t end_position = row.start_position + int64_t(row.tokens.size());
  const int64_t num_blocks_needed = written_blocks(row, extent.kv_block_size).second;
  JAMBO_REQUIRE(int64_t(row.block_table.size()) >= num_blocks_needed,
                "sequence {}: block table has {} blocks but positions up to {} need {}", id, row.block_table.size(),
                end_position, num_blocks_needed);
  for (int64_t i = 0; i < num_blocks_needed; ++i)
    JAMBO_REQUIRE(row.block_table[i] >= 0 && row.block_table[i] < extent.num_kv_blocks,
                  "sequence {}: KV block {} (logical block {}) is out of range [0, {})", id, row.block_table[i], i,
                  extent.num_kv_blocks);
}

// A block this step writes into must belong to that row alone; blocks that are only read (a shared
// prompt prefix) may appear in several rows. The written blocks, sorted with their rows, are looked up by binary
// search, past a bitmap of their low 16 bits that rules out at once nearly every block only read (a batch-256
// decode step of 20 blocks a row, one core of a 2-core x86 machine: 130 us to validate with a std::map of
// writers, 36 us with the binary search alone, 10 us with the bitmap in front).
void validate_kv_writes(std::span<const BatchRow> rows, const CacheExtent& extent) {
  std::vector<std::pair<int32_t, int64_t>> writers;  // (block, index of a row writing it)
  std::bitset<65536> maybe_written;                  // by the block's low 16 bits
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto [first, end] = written_blocks(rows[r], extent.kv_block_size);
    for (int64_t i = first; i < end; ++i) {
      writers.emplace_back(rows[r].block_table[i], int64_t(r));
      maybe_written.set(uint32_t(rows[r].block_table[i]) & 0xffffu);
    }
  }
  std::sort(writers.begin(), writers.end());
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t num_blocks = written_blocks(rows[r], extent.kv_block_size).second;
    for (int64_t i = 0; i < num_blocks; ++i) {
      const int32_t block = rows[r].block_table[i];
      if (!maybe_written.test(uint32_t(block) & 0xffffu)) continue;
      // The block's first writer in row order.
      const auto writer = std::lower_bound(writers.begin(), writers.end(), std::pair<int32_t, int64_t>{block, 0});
      JAMBO_REQUIRE(writer == writers.end() || writer->first != block || writer->second == int64_t(r),
                    "sequence {}: KV block {} is written by sequence {} in the same step", rows[r].sequence_id, block,
                    rows[writer->second].sequence_id);
    }
  }
}

// No slot in two rows, and no checkpoint written twice: sorted, then (only to name the row) scanned in row order.
void validate_distinct_slots(std::span<const BatchRow> rows) {
  std::vector<int64_t> slots;
  for (const BatchRow& row : rows) {
    slots.push_back(row.slot);
    for (const StateCheckpoint& checkpoint : row.checkpoints) slots.push_back(checkpoint.slot);
  }
  std::sort(slots.begin(), slots.end());
  if (std::adjacent_find(slots.begin(), slots.end()) == slots.end()) return;
  std::set<int64_t> seen;
  for (const BatchRow& row : rows) {
    JAMBO_REQUIRE(seen.insert(row.slot).second, "sequence {}: state slot {} is used by two rows of one step",
                  row.sequence_id, row.slot);
    for (const StateCheckpoint& checkpoint : row.checkpoints)
      JAMBO_REQUIRE(seen.insert(checkpoint.slot).second, "sequence {}: checkpoint slot {} is written twice in one step",
                    row.sequence_id, checkpoint.slot);
  }
}

}  // namespace

void validate_rows(std::span<const BatchRow> rows, const model::JambaConfig& config, const CacheExtent& extent) {
  const bool has_attention = config.num_attention_layers() > 0;
  for (const BatchRow& row : rows) {
    validate_row(row, config, extent);
    if (has_attention) validate_block_table(row, extent);
  }
  validate_distinct_slots(rows);
  if (has_attention) validate_kv_writes(rows, extent);
}

void require_kv_block(int64_t block, int64_t num_kv_blocks) {
  JAMBO_REQUIRE(block >= 0 && block < num_kv_blocks, "KV block {} is out of range [0, {})", block, num_kv_blocks);
}

void require_state_slot(int64_t slot, int64_t num_state_slots, const char* action) {
  JAMBO_REQUIRE(slot >= 0 && slot < num_state_slots, "{}: state slot {} is out of range [0, {})", action, slot,
                num_state_slots);
}

void require_state_offset_modulus(int64_t modulus, int64_t elements_per_slot, int64_t num_state_slots) {
  JAMBO_REQUIRE(modulus == 0 ||
                    (modulus > 0 && modulus % elements_per_slot == 0 && modulus <= num_state_slots * elements_per_slot),
                "state offset modulus {} must be 0 or a multiple of the slot size {} within the pool", modulus,
                elements_per_slot);
}

void require_state_dtype(DType dtype) {
  JAMBO_REQUIRE(is_state_dtype(dtype), "the recurrent state is stored as F32 or BF16, not {}", dtype_name(dtype));
}

}  // namespace jambo::backend
