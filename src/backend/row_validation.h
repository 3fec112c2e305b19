// The checks every backend makes on a step's rows and on its cache arguments, so that the CPU and the
// CUDA backend reject exactly the same input with the same message (law 1 and law 2 among them).
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <span>

namespace jambo::backend {

// The sizes of the caches a backend holds, as the checks need them.
struct CacheExtent {
  int64_t num_state_slots = 0;
  int64_t num_kv_blocks = 0;
  int64_t kv_block_size = 0;
  int64_t num_checkpoints = 0;  // checkpoint slots, after the state slots
};

// Throws jambo::Error naming the request when a row is malformed: no tokens, a token outside the
// vocabulary, has_initial_state not matching start_position > 0 (law 1), a slot out of range or used by
// two rows, a block table too short or out of range, a KV block or a checkpoint written by two rows (law 2), or a
// checkpoint outside the row's tokens, out of order, or not a checkpoint slot.
void validate_rows(std::span<const BatchRow> rows, const model::JambaConfig& config, const CacheExtent& extent);

// Throws jambo::Error when a KV block index is out of range (copy_kv_block).
void require_kv_block(int64_t block, int64_t num_kv_blocks);

// Throws jambo::Error when a state slot index is out of range; `action` names the caller.
void require_state_slot(int64_t slot, int64_t num_state_slots, const char* action);

// Throws jambo::Error unless the recurrent state can be stored as this type (F32 or BF16).
void require_state_dtype(DType dtype);

// Throws jambo::Error unless the test-only offset modulus is 0 or a multiple of the slot size within the pool.
void require_state_offset_modulus(int64_t modulus, int64_t elements_per_slot, int64_t num_state_slots);

}  // namespace jambo::backend
