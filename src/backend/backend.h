// The interface between the engine and a compute backend (CPU reference now, CUDA later).
// The engine describes one step as rows; the backend owns the memory of the recurrent-state slots
// and the paged KV cache and runs the forward pass over all rows at once.
#pragma once

#include "core/error.h"
#include "model/weights.h"

#include <cstdint>
#include <span>
#include <vector>

namespace jambo {

// Sizes of the caches a backend allocates when it is created.
struct CacheConfig {
  int64_t num_state_slots = 1;  // recurrent-state slots (conv tail + SSM state of every Mamba layer)
  int64_t num_kv_blocks = 1;    // paged KV blocks (each holds kv_block_size tokens of every attention layer)
  int64_t kv_block_size = 16;   // tokens per KV block
};

// One request's share of a forward step.
struct BatchRow {
  int64_t request_id = 0;              // carried for traces and error messages
  std::span<const int32_t> tokens;     // [num_tokens] this step's input tokens
  int64_t start_position = 0;          // tokens already folded into this row's state and KV
  bool has_initial_state = false;      // law 1: false => zero state; the slot is never read
  int64_t slot = 0;                    // recurrent-state slot this row reads (if has_initial_state) and writes
  std::span<const int32_t> block_table;  // physical KV block of each logical block covering
                                         // positions [0, start_position + num_tokens)
  bool all_logits = false;             // logits for every token of the step, else only the last
};

// Logits of one step: rows in order, each contributing num_tokens (all_logits) or 1 vectors.
struct StepLogits {
  int64_t vocab_size = 0;
  std::vector<float> values;          // [num_vectors, vocab_size]
  std::vector<int64_t> first_vector;  // [num_rows] index of each row's first vector
  std::span<const float> row(int64_t row_index, int64_t position_in_step = 0) const {
    const int64_t index = first_vector[row_index] + position_in_step;
    JAMBO_ASSERT(index >= 0 && element_offset(index + 1, vocab_size) <= int64_t(values.size()));
    return {values.data() + element_offset(index, vocab_size), size_t(vocab_size)};
  }
};

// Test-only faults that reproduce the two historical state-cache bugs (DESIGN.md), so that a test can
// show the forensics catch them (`--inject`). Never set in normal runs.
struct FaultInjection {
  // A row whose step is one token is run as a decode even without state: the Mamba kernels read the
  // slot's leftover state (the "decode before prefill" bug).
  bool decode_before_prefill = false;
  // Offsets into the recurrent-state pool wrap at this many elements, as a 32-bit offset wraps at 2^32
  // (0: never). A multiple of one slot's size keeps the wrapped offset inside the pool.
  int64_t state_offset_modulus = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const JambaConfig& config() const = 0;
  // Runs the model over all rows; reads and updates each row's slot and KV blocks.
  virtual void forward(std::span<const BatchRow> rows, StepLogits& logits) = 0;
  // Copies the recurrent state of one slot into another (n samples of one prompt).
  virtual void copy_state(int64_t from_slot, int64_t to_slot) = 0;
  // Copies one KV block (every attention layer, keys and values) into another (n samples of one prompt).
  virtual void copy_kv_block(int64_t from_block, int64_t to_block) = 0;
  // Fills a slot with NaN so that any read of it shows (law 2, checked mode).
  virtual void poison_state(int64_t slot) = 0;
  // Elements of one slot's recurrent state (all Mamba layers).
  virtual int64_t state_elements_per_slot() const = 0;
  virtual void inject_faults(const FaultInjection& faults) = 0;
};

}  // namespace jambo
