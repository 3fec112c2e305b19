// The interface between the engine and a compute backend (the CPU reference, CUDA).
// The engine describes one step as rows; the backend owns the memory of the recurrent-state slots
// and the paged KV cache and runs the forward pass over all rows at once.
#pragma once

#include "core/error.h"
#include "model/weight_update.h"
#include "model/weights.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace jambo::backend {

// Sizes of the caches a backend allocates when it is created.
struct CacheConfig {
  int64_t num_state_slots = 1;     // recurrent-state slots (conv tail + SSM state of every Mamba layer)
  int64_t num_kv_blocks = 1;       // paged KV blocks (each holds kv_block_size tokens of every attention layer)
  int64_t kv_block_size = 16;      // tokens per KV block
  DType state_dtype = DType::F32;  // storage of the recurrent state: F32, or BF16 (half the memory; state_values.h)
  // Recurrent-state checkpoints of cached prefixes, the same size as a slot and addressed as slots
  // [num_state_slots, num_state_slots + num_checkpoints): a row saves into them (BatchRow::checkpoints), copy_state
  // restores one into a sequence's slot, poison_state poisons an evicted one. No row runs in them.
  int64_t num_checkpoints = 0;
};

// KV blocks of kv_block_size tokens that hold num_tokens tokens: the one place the paged cache rounds up.
inline int64_t kv_blocks_for(int64_t num_tokens, int64_t kv_block_size) {
  return (num_tokens + kv_block_size - 1) / kv_block_size;
}

struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0.0;
};

// A token chosen from a row's last logits vector by the backend, where the logits are: only the id and
// the requested logprobs cross to the host. The choice is a pure function of the vector and these fields;
// the randomness is the sample's own seeded draw, made by the engine before the step.
struct TokenChoice {
  double temperature = 0.0;      // 0: greedy (the highest logit; ties go to the lower id)
  int64_t top_k = 0;             // 0: no limit
  double top_p = 1.0;            // 1: no limit
  double min_p = 0.0;            // 0: no limit; else drop tokens below min_p times the top probability
  double uniform = 0.0;          // [0, 1): where the draw falls in the kept probability mass
  int64_t num_top_logprobs = 0;  // K most likely tokens reported with the choice
};

// Log-probabilities are always those of the model's unmodified distribution (log-softmax of the logits).
struct ChosenToken {
  int32_t token = 0;
  double logprob = 0.0;
  std::vector<TokenLogprob> top_logprobs;  // [num_top_logprobs] most likely first
};

// Which logits vectors of a row are copied to the host whole (references in tests, benchmarks).
enum class LogitsCopy { None, Last, All };

// A checkpoint a row saves: its state after its first num_tokens tokens of the step, written into the checkpoint
// slot from inside the step (the conv tails and the scan's state at that token), so that saving never splits a step.
struct StateCheckpoint {
  int64_t num_tokens = 0;  // 1 .. the row's tokens
  int64_t slot = 0;        // a checkpoint slot (CacheConfig::num_checkpoints)
};

// One request's share of a forward step, and what the step returns for it.
struct BatchRow {
  int64_t sequence_id = 0;               // the engine-wide Sequence::id: named by errors, joined to traces (law 6)
  std::span<const int32_t> tokens;       // [num_tokens] this step's input tokens
  int64_t start_position = 0;            // tokens already folded into this row's state and KV
  bool has_initial_state = false;        // law 1: false => zero state; the slot is never read
  int64_t slot = 0;                      // recurrent-state slot this row reads (if has_initial_state) and writes
  std::span<const int32_t> block_table;  // physical KV block of each logical block covering
                                         // positions [0, start_position + num_tokens)
  std::span<const int32_t> targets;      // [<= num_tokens] the logprob of targets[i] under logits vector i
  int64_t num_top_logprobs = 0;          // K most likely tokens of each vector with a target
  std::span<const TokenChoice> choices;  // tokens chosen from the last vector (n samples forking share one)
  LogitsCopy copy_logits = LogitsCopy::None;
  bool routed_experts = false;           // return the experts each MoE layer routed each token to
  std::span<const StateCheckpoint> checkpoints;  // by increasing num_tokens
};

// The one way every driver (the engine's model runner, the scoring references, the benchmark) describes a row: tokens
// [start_position, start_position + num_tokens) of a sequence whose first start_position tokens are already in its
// state slot and KV blocks. Law 1: the row has an initial state exactly when some of the sequence ran before; a row
// at position 0 starts from zero state and never reads its slot. The block table is cut to the blocks it covers.
// What a row asks of its logits (targets, top-K, choices, copies) the caller sets after.
inline BatchRow sequence_row(int64_t sequence_id, std::span<const int32_t> sequence_tokens, int64_t start_position,
                             int64_t num_tokens, int64_t slot, std::span<const int32_t> block_table,
                             int64_t kv_block_size) {
  BatchRow row;
  row.sequence_id = sequence_id;
  row.tokens = sequence_tokens.subspan(size_t(start_position), size_t(num_tokens));
  row.start_position = start_position;
  row.has_initial_state = start_position > 0;
  row.slot = slot;
  const int64_t num_blocks = kv_blocks_for(start_position + num_tokens, kv_block_size);
  row.block_table = block_table.first(std::min(block_table.size(), size_t(num_blocks)));
  return row;
}

// A row computes the logits of every position when it scores targets or copies them all, else of its last.
inline bool computes_all_vectors(const BatchRow& row) {
  return !row.targets.empty() || row.copy_logits == LogitsCopy::All;
}

struct RowOutput {
  std::vector<double> target_logprobs;                         // [targets]
  std::vector<std::vector<TokenLogprob>> target_top_logprobs;  // [targets][num_top_logprobs]
  std::vector<ChosenToken> chosen;                             // [choices]
  bool finite = true;  // every logits vector the row computed was finite (a poisoned state shows here)
  // Where the row asked: the top-k experts of each token in each MoE layer, in increasing expert order.
  std::vector<int32_t> routed_experts;  // [num_tokens, num_moe_layers, k]
};

// What one step returns: an output per row, and the logits vectors the rows asked to copy.
struct StepOutput {
  std::vector<RowOutput> rows;  // [num_rows]
  int64_t vocab_size = 0;
  std::vector<float> values;          // [num_copied_vectors, vocab_size]
  std::vector<int64_t> first_vector;  // [num_rows] index of each row's first copied vector (-1: none)

  // Makes room for the next row's copies, of its num_vectors computed vectors, and records where they start;
  // returns the computed vector copied first (the row's copy_logits decides: none, the last, or all) and where
  // the copies go (num_copied vectors; none: null).
  struct CopyTarget {
    int64_t first_computed = 0, num_copied = 0;
    float* values = nullptr;
  };
  CopyTarget add_copies(const BatchRow& row, int64_t num_vectors) {
    if (row.copy_logits == LogitsCopy::None) {
      first_vector.push_back(-1);
      return {};
    }
    const int64_t num_copied = row.copy_logits == LogitsCopy::All ? num_vectors : 1;
    const size_t old_size = values.size();
    first_vector.push_back(int64_t(old_size) / vocab_size);
    values.resize(old_size + size_t(element_offset(num_copied, vocab_size)));
    return {num_vectors - num_copied, num_copied, values.data() + old_size};
  }
  // Copied vector `position` of a row (with LogitsCopy::Last, position 0 is the last token's).
  std::span<const float> logits(int64_t row_index, int64_t position = 0) const {
    const int64_t index = first_vector[row_index] + position;
    JAMBO_ASSERT(first_vector[row_index] >= 0 && index >= 0 &&
                 element_offset(index + 1, vocab_size) <= int64_t(values.size()));
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

// A tensor in another process's GPU memory, shared by CUDA IPC (POST /update_weights_from_ipc): what PyTorch's
// storage._share_cuda_() gives, as tools/jambo_ipc.py sends it.
struct IpcTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::array<std::byte, 64> handle{};  // the cudaIpcMemHandle_t of the allocation holding it
  int64_t offset = 0;                  // bytes from the allocation's start to the tensor's first element
};

// How deep a backend sleeps: level 1 keeps the weights (in host memory), level 2 drops them.
enum class SleepLevel { KeepWeights = 1, DropWeights = 2 };
// What a wake_up takes back (vLLM's tags "weights" and "kv_cache").
struct WakeTags {
  bool weights = false;
  bool caches = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const model::JambaConfig& config() const = 0;
  // Runs the model over all rows; reads and updates each row's slot and KV blocks; fills output.rows (and
  // the copied logits) for every row.
  virtual void forward(std::span<const BatchRow> rows, StepOutput& output) = 0;
  // Copies the recurrent state of one slot into another (n samples of one prompt; a cached prefix's checkpoint into
  // the slot of the sequence that resumes from it).
  virtual void copy_state(int64_t from_slot, int64_t to_slot) = 0;
  // Copies one KV block (every attention layer, keys and values) into another (n samples of one prompt).
  virtual void copy_kv_block(int64_t from_block, int64_t to_block) = 0;
  // Fills a slot with NaN so that any read of it shows (law 2, checked mode).
  virtual void poison_state(int64_t slot) = 0;
  // Elements of one slot's recurrent state (all Mamba layers).
  virtual int64_t state_elements_per_slot() const = 0;
  virtual void inject_faults(const FaultInjection& faults) = 0;
  // Replaces the weights named in `update` (model/weight_update.h: read and checked against the model this backend
  // was made from) with its values, copied into memory of the backend's own, so that the folder may change after.
  // Between steps only, the weights awake. Throws jambo::Error, nothing changed, where the backend cannot hold a
  // value (the CUDA backend's f16 mode).
  virtual void update_weights(const model::WeightUpdate& update) = 0;
  // The tensors' memory opened in this process (the CUDA backend; the CPU backend throws jambo::Error), as a
  // checkpoint whose storage closes it again: each allocation once, each tensor inside its allocation.
  virtual model::Checkpoint open_ipc_tensors(std::span<const IpcTensor> tensors) = 0;

  // Sleep (vLLM's /sleep), between steps, with no request holding a slot or a KV block: lets go of the memory of
  // the caches (the recurrent-state pool, the KV cache, the workspaces; their contents are lost) and, at
  // SleepLevel::DropWeights, of the weights, whose wake reads the checkpoint the backend was made from again (an
  // update's values are gone). At KeepWeights the weights wait in host memory, as they are. wake_up takes back the
  // weights, the caches (zeroed), or both; nothing runs until both are back.
  virtual void sleep(SleepLevel level) = 0;
  virtual void wake_up(const WakeTags& tags) = 0;
};

}  // namespace jambo::backend
