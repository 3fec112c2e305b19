// Sizes the state slots and KV blocks from a memory budget, like vLLM's gpu_memory_utilization.
#pragma once

#include "backend/backend.h"
#include "engine/backend_factory.h"
#include "model/config.h"

#include <cstdint>
#include <string>

namespace jambo::engine {

// A memory budget as given: bytes, or a fraction of the memory available to the backend when the engine starts.
struct MemoryBudget {
  int64_t bytes = 0;    // when > 0: this many bytes
  double fraction = 0;  // else: this fraction, in (0, 1], of available_memory_bytes

  // The budget in bytes on that backend, reading the memory it has available now for a fraction.
  int64_t resolve(BackendKind backend) const;
  bool operator==(const MemoryBudget&) const = default;
};

// "8e9", "8000000000" or "2GiB"/"512MiB" are bytes; a number in (0, 1] is a fraction of the memory available to
// the backend (resolved when the engine starts). Throws jambo::Error naming the value when it is neither.
MemoryBudget parse_memory_budget(const std::string& text);

// The budget as --memory-budget spells it: its bytes, or its fraction.
std::string to_string(const MemoryBudget& budget);

// Elements of one state slot: conv tail [Di, K-1] and SSM state [Di, N] of every Mamba layer.
int64_t state_elements_per_slot(const model::JambaConfig& config);

struct CachePlan {
  backend::CacheConfig cache;      // slots, KV blocks and the state's type for the backend
  int64_t bytes_per_slot = 0;      // recurrent state of one sequence (all Mamba layers, of cache.state_dtype)
  int64_t bytes_per_kv_block = 0;  // one block of all attention layers, keys and values, fp32
  int64_t weight_bytes = 0;        // taken from the budget first
};

// The budget (bytes) that plan_cache, given max_num_seqs = num_slots, splits into exactly num_slots state slots
// and num_kv_blocks KV blocks beside weight_bytes: for tests and stress runs that need a precise squeeze.
int64_t exact_memory_budget(const model::JambaConfig& config, int64_t weight_bytes, int64_t num_slots,
                            int64_t num_kv_blocks, int64_t kv_block_size, DType state_dtype);

// The prefix cache's recurrent-state checkpoints (the size of a slot each): up to max_count (0: none), taken before
// the KV blocks where reserved, else from what the KV blocks leave over.
struct CheckpointWish {
  int64_t max_count = 0;
  bool reserved = false;
};

// Splits budget_bytes minus the weights between slots and KV blocks: num_state_slots =
// min(max_num_seqs, what fits), and the rest as KV blocks (and checkpoints, as wished). Throws jambo::Error, saying
// how much one request of max_model_len tokens needs, when the budget cannot hold even one such request.
CachePlan plan_cache(const model::JambaConfig& config, int64_t weight_bytes, int64_t budget_bytes, int64_t max_num_seqs,
                     int64_t kv_block_size, int64_t max_model_len, DType state_dtype, CheckpointWish checkpoints = {});

}  // namespace jambo::engine
