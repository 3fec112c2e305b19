#include "backend/cpu/state_memory.h"

#include "backend/row_validation.h"
#include "core/error.h"
#include "core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace jambo::backend::cpu {

MappedMemory::MappedMemory(int64_t num_bytes, const char* purpose) : num_bytes_(num_bytes) {
  JAMBO_REQUIRE(num_bytes >= 0, "{}: negative size {}", purpose, num_bytes);
  if (num_bytes_ == 0) return;
  data_ = mmap(nullptr, size_t(num_bytes_), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  JAMBO_REQUIRE(data_ != MAP_FAILED, "{}: cannot reserve {} bytes: {}", purpose, num_bytes_, std::strerror(errno));
}

MappedMemory::~MappedMemory() {
  if (data_ != nullptr) munmap(data_, size_t(num_bytes_));
}

void MappedMemory::discard() {
  if (data_ != nullptr)
    JAMBO_REQUIRE(madvise(data_, size_t(num_bytes_), MADV_DONTNEED) == 0, "cannot give back {} bytes: {}", num_bytes_,
                  std::strerror(errno));
}

StatePool::StatePool(const model::JambaConfig& config, int64_t num_slots, DType state_dtype)
    : num_slots_(num_slots),
      layout_(config),
      dtype_(state_dtype),
      memory_(layout_.pool_bytes(num_slots, state_dtype), "recurrent-state pool") {
  JAMBO_REQUIRE(num_slots > 0, "the recurrent-state pool needs at least one slot, got {}", num_slots);
  require_state_dtype(state_dtype);
}

void StatePool::require_slot(int64_t slot, const char* action) const { require_state_slot(slot, num_slots_, action); }

StateValues StatePool::slot_begin(int64_t slot) {
  const int64_t offset = element_offset(slot, layout_.slot_stride);
  return StateValues{memory_.data(), dtype_} + (offset_modulus_ > 0 ? offset % offset_modulus_ : offset);
}

void StatePool::wrap_offsets_at(int64_t modulus) {
  require_state_offset_modulus(modulus, layout_.slot_stride, num_slots_);
  offset_modulus_ = modulus;
}

StateValues StatePool::conv_tail(int64_t slot, int64_t mamba_layer) {
  return slot_begin(slot) + element_offset(mamba_layer, layout_.layer_stride);
}

StateValues StatePool::ssm_state(int64_t slot, int64_t mamba_layer) {
  return conv_tail(slot, mamba_layer) + layout_.conv_tail_size;
}

void StatePool::copy(int64_t from_slot, int64_t to_slot) {
  require_slot(from_slot, "copy_state");
  require_slot(to_slot, "copy_state");
  if (from_slot == to_slot) return;
  std::memcpy(slot_begin(to_slot).data, slot_begin(from_slot).data, size_t(layout_.pool_bytes(1, dtype_)));
}

void StatePool::poison(int64_t slot) {
  require_slot(slot, "poison_state");
  const StateValues values = slot_begin(slot);
  for (int64_t i = 0; i < layout_.slot_stride; ++i) values.set(i, std::numeric_limits<float>::quiet_NaN());
}

KvCache::KvCache(const model::JambaConfig& config, const CacheConfig& cache)
    : num_blocks_(cache.num_kv_blocks),
      block_size_(cache.kv_block_size),
      token_stride_(config.num_key_value_heads * config.head_dim),
      half_stride_(cache.kv_block_size * token_stride_),
      layer_stride_(2 * half_stride_),
      block_stride_(config.num_attention_layers() * layer_stride_),
      memory_(element_offset(element_offset(cache.num_kv_blocks, block_stride_), sizeof(float)), "KV cache") {
  JAMBO_REQUIRE(cache.kv_block_size > 0, "kv_block_size must be positive, got {}", cache.kv_block_size);
  JAMBO_REQUIRE(cache.num_kv_blocks >= 0, "num_kv_blocks must not be negative, got {}", cache.num_kv_blocks);
}

float* KvCache::entry(int64_t block, int64_t attention_layer, int64_t key_or_value, int64_t position_in_block) {
  return static_cast<float*>(memory_.data()) + element_offset(block, block_stride_) +
         element_offset(attention_layer, layer_stride_) + element_offset(key_or_value, half_stride_) +
         element_offset(position_in_block, token_stride_);
}

float* KvCache::key(int64_t block, int64_t attention_layer, int64_t position_in_block) {
  return entry(block, attention_layer, 0, position_in_block);
}

float* KvCache::value(int64_t block, int64_t attention_layer, int64_t position_in_block) {
  return entry(block, attention_layer, 1, position_in_block);
}

}  // namespace jambo::backend::cpu
