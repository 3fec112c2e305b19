// One step's row descriptions as the kernels see them: per-row offsets (64-bit) and a per-token row index,
// so that every kernel handles all rows of a step in one launch. Plain device pointers (no host types), so
// that .cu files include it alone.
#pragma once

#include "backend/cuda/device_memory.h"
#include "core/host_device.h"

#include <cstdint>

namespace jambo::backend::cuda {

// Rows of several tokens are cut into chunks of this many tokens: a block of the prefill attention takes one, and the
// prefill scan stages a chunk's B and C at a time (attention.h, mamba.h).
constexpr int64_t kScanChunkTokens = 64;

// Attention sums a query's keys in splits of this many positions from position 0, and folds the splits' results in
// order: the same arithmetic for a query of a prefill and of a decode step (attention.h).
constexpr int64_t kAttentionSplitKeys = 128;

// The splits of keys of a query at `position`: the positions 0 .. position, kAttentionSplitKeys at a time.
JAMBO_HOST_DEVICE inline int64_t num_key_splits(int64_t position) { return position / kAttentionSplitKeys + 1; }

// Device pointers into one upload; valid until the next upload.
struct DeviceRows {
  int64_t num_rows = 0;
  int64_t num_tokens = 0;                       // T, all rows' tokens
  int64_t num_vectors = 0;                      // logits asked for
  const int64_t* first_token = nullptr;         // [num_rows] index of the row's first token in the step
  const int64_t* row_tokens = nullptr;          // [num_rows] tokens of the row in this step
  const int64_t* start_position = nullptr;      // [num_rows] tokens already in the row's state and KV
  const int64_t* state_offset = nullptr;        // [num_rows] element offset of the row's slot in the state pool
  const int64_t* block_table_offset = nullptr;  // [num_rows] index of the row's first entry in block_tables
  const int32_t* reads_state = nullptr;         // [num_rows] 1: Mamba kernels read the slot (law 1), 0: zero state
  const int32_t* token_row = nullptr;           // [T] the row of each token
  const int32_t* tokens = nullptr;              // [T] token ids
  const int32_t* block_tables = nullptr;        // [sum of the rows' table lengths] physical KV blocks
  const int64_t* selected = nullptr;            // [num_vectors] step token index of each logits vector
  // The rows of several tokens cut into chunks of kScanChunkTokens (the last of a row may be shorter), in row order.
  int64_t num_chunked_rows = 0;  // rows of several tokens
  int64_t num_chunks = 0;
  const int64_t* chunk_first_token = nullptr;  // [num_chunks] step token index of the chunk's first token
  const int32_t* chunk_row = nullptr;          // [num_chunks] the chunk's row
  // The rows of one token (decode) keep a partial result per split of their keys (num_key_splits), in row order.
  int64_t num_splits = 0;
  const int64_t* row_first_split = nullptr;  // [num_rows] the row's first split (rows of several tokens have none)
  // Checkpoints before a row's last token (is_inside_row), in row order and by increasing tokens: the conv and the
  // prefill scan write the state there as they pass. One after the last token is a copy of the slot after the step.
  int64_t num_checkpoints = 0;
  const int64_t* row_first_checkpoint = nullptr;  // [num_rows + 1] the row's checkpoints are [this, next row's)
  const int64_t* checkpoint_tokens = nullptr;     // [num_checkpoints] tokens of the row's step before it, >= 1
  const int64_t* checkpoint_offset = nullptr;     // [num_checkpoints] element offset of its slot in the state pool
};

}  // namespace jambo::backend::cuda
