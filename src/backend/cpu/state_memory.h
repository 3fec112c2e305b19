// The memory a request keeps between steps: recurrent-state slots and the paged KV cache.
// Both live in anonymous MAP_NORESERVE mappings, so a pool reserved far beyond what is used costs
// only the pages touched (a test can place a slot past 2^32 elements). Every offset into them is
// formed by element_offset (DESIGN.md law 3).
#pragma once

#include "backend/backend.h"
#include "backend/state_layout.h"
#include "backend/state_values.h"
#include "model/config.h"

#include <cstdint>

namespace jambo::backend::cpu {

// An anonymous, lazily committed, zero-filled buffer.
class MappedMemory {
 public:
  MappedMemory(int64_t num_bytes, const char* purpose);
  ~MappedMemory();
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;

  void* data() const { return data_; }
  // Gives the pages back to the system (a sleeping backend's caches); the next touch of one finds it zeroed.
  void discard();

 private:
  void* data_ = nullptr;
  int64_t num_bytes_ = 0;
};

// Per slot and per Mamba layer: the conv tail (the last K-1 inputs u) and the SSM state, stored as state_dtype.
class StatePool {
 public:
  StatePool(const model::JambaConfig& config, int64_t num_slots, DType state_dtype);

  int64_t num_slots() const { return num_slots_; }
  StateValues conv_tail(int64_t slot, int64_t mamba_layer);  // [Di, K-1], oldest input first
  StateValues ssm_state(int64_t slot, int64_t mamba_layer);  // [Di, N]
  void copy(int64_t from_slot, int64_t to_slot);
  void poison(int64_t slot);  // fills the slot with NaN
  int64_t elements_per_slot() const { return layout_.slot_stride; }
  // Test-only (FaultInjection): slot offsets wrap at this many elements; 0 turns wrapping off.
  void wrap_offsets_at(int64_t modulus);
  void discard() { memory_.discard(); }  // every slot's memory back to the system, zeroed when next used

 private:
  StateValues slot_begin(int64_t slot);
  void require_slot(int64_t slot, const char* action) const;

  int64_t num_slots_;
  StateSlotLayout layout_;
  int64_t offset_modulus_ = 0;  // test-only fault; 0: offsets never wrap
  DType dtype_;
  MappedMemory memory_;  // [num_slots, num_mamba_layers, Di * (K-1 + N)] of dtype_
};

// [num_kv_blocks, num_attention_layers, 2 (key, value), kv_block_size, nkv, hd], fp32.
class KvCache {
 public:
  KvCache(const model::JambaConfig& config, const CacheConfig& cache);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  float* key(int64_t block, int64_t attention_layer, int64_t position_in_block);    // [nkv, hd]
  float* value(int64_t block, int64_t attention_layer, int64_t position_in_block);  // [nkv, hd]
  void discard() { memory_.discard(); }  // every block's memory back to the system, zeroed when next used

 private:
  float* entry(int64_t block, int64_t attention_layer, int64_t key_or_value, int64_t position_in_block);

  int64_t num_blocks_;
  int64_t block_size_;
  int64_t token_stride_;  // nkv * hd
  int64_t half_stride_;   // block_size * token_stride_ (all keys, or all values, of one layer)
  int64_t layer_stride_;  // 2 * half_stride_
  int64_t block_stride_;  // num_attention_layers * layer_stride_
  MappedMemory memory_;   // fp32
};

}  // namespace jambo::backend::cpu
