#include "engine/kv_block_manager.h"

#include "backend/backend.h"
#include "core/error.h"

#include <limits>

namespace jambo::engine {

KvBlockManager::KvBlockManager(int64_t num_blocks, int64_t block_size, bool model_has_attention)
    : num_blocks_(num_blocks), block_size_(block_size), model_has_attention_(model_has_attention) {
  JAMBO_REQUIRE(block_size > 0, "KV block size must be positive, got {}", block_size);
  // Block ids are int32_t in block tables.
  JAMBO_REQUIRE(num_blocks >= 0 && num_blocks <= std::numeric_limits<int32_t>::max(),
                "number of KV blocks {} is out of range [0, 2^31)", num_blocks);
  free_blocks_.reserve(num_blocks);
  for (int64_t block = num_blocks - 1; block >= 0; --block) free_blocks_.push_back(int32_t(block));
  num_holders_.assign(num_blocks, 0);
}

int64_t KvBlockManager::blocks_for(int64_t num_tokens) const {
  JAMBO_REQUIRE(num_tokens >= 0, "cannot size KV blocks for a negative token count {}", num_tokens);
  if (!model_has_attention_) return 0;
  return backend::kv_blocks_for(num_tokens, block_size_);
}

int64_t KvBlockManager::full_blocks(int64_t num_tokens) const {
  JAMBO_REQUIRE(num_tokens >= 0, "cannot size KV blocks for a negative token count {}", num_tokens);
  return model_has_attention_ ? num_tokens / block_size_ : 0;
}

bool KvBlockManager::can_grow(const std::vector<int32_t>& table, int64_t num_tokens) const {
  return blocks_for(num_tokens) - int64_t(table.size()) <= num_free();
}

void KvBlockManager::grow(std::vector<int32_t>& table, int64_t num_tokens) {
  const int64_t num_blocks_needed = blocks_for(num_tokens);
  JAMBO_REQUIRE(can_grow(table, num_tokens), "{} tokens need {} KV blocks; the table has {} and only {} are free",
                num_tokens, num_blocks_needed, table.size(), num_free());
  while (int64_t(table.size()) < num_blocks_needed) {
    const int32_t block = free_blocks_.back();
    free_blocks_.pop_back();
    num_holders_[block] = 1;
    table.push_back(block);
  }
}

void KvBlockManager::share(const std::vector<int32_t>& from, int64_t num_blocks, std::vector<int32_t>& to) {
  JAMBO_REQUIRE(to.empty() && num_blocks >= 0 && num_blocks <= int64_t(from.size()),
                "cannot share {} KV blocks of a table of {} into a table of {}", num_blocks, from.size(), to.size());
  for (int64_t i = 0; i < num_blocks; ++i) {
    const int32_t block = from[i];
    JAMBO_REQUIRE(block >= 0 && block < num_blocks_ && num_holders_[block] > 0,
                  "KV block {} is shared but is not in use", block);
    ++num_holders_[block];
    to.push_back(block);
  }
}

void KvBlockManager::free(std::vector<int32_t>& table) {
  // Released last block first, so the table's first block is the next one handed out again.
  for (auto block = table.rbegin(); block != table.rend(); ++block) release(*block);
  table.clear();
}

void KvBlockManager::hold(int32_t block) {
  JAMBO_REQUIRE(block >= 0 && block < num_blocks_ && num_holders_[block] > 0, "KV block {} is held but is not in use",
                block);
  ++num_holders_[block];
}

void KvBlockManager::release(int32_t block) {
  JAMBO_REQUIRE(block >= 0 && block < num_blocks_ && num_holders_[block] > 0,
                "KV block {} is freed but is not in use (freed twice, or never allocated)", block);
  if (--num_holders_[block] == 0) free_blocks_.push_back(block);
}

}  // namespace jambo::engine
