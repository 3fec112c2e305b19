// The paged KV cache's bookkeeping: which physical blocks are free, how many tables hold each block in use, and
// how many blocks a sequence of a given length needs. The memory itself belongs to the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace jambo::engine {

class KvBlockManager {
 public:
  // num_blocks may be 0 for models without attention layers: then every request needs 0 blocks.
  KvBlockManager(int64_t num_blocks, int64_t block_size, bool model_has_attention);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const { return int64_t(free_blocks_.size()); }
  int64_t num_used() const { return num_blocks_ - num_free(); }

  // Blocks needed to hold num_tokens tokens in total.
  int64_t blocks_for(int64_t num_tokens) const;
  // Blocks that num_tokens tokens fill completely (no later token is written into them).
  int64_t full_blocks(int64_t num_tokens) const;
  // Whether a table holding `table.size()` blocks can grow to hold num_tokens tokens.
  bool can_grow(const std::vector<int32_t>& table, int64_t num_tokens) const;
  // Appends blocks to the table until it holds num_tokens tokens; throws when there are too few.
  void grow(std::vector<int32_t>& table, int64_t num_tokens);
  // Appends the first num_blocks blocks of `from` to the empty table `to`, which holds them too: the samples of
  // a request share its prompt's full blocks, which are only read from then on.
  void share(const std::vector<int32_t>& from, int64_t num_blocks, std::vector<int32_t>& to);
  // Lets go of every block of the table and empties it; a block is free again once no table holds it. Throws on a
  // block that is not in use.
  void free(std::vector<int32_t>& table);
  // One more holder of a block in use (the prefix cache), and one fewer (free again at none); throw on a block not in
  // use.
  void hold(int32_t block);
  void release(int32_t block);
  int64_t num_holders(int32_t block) const { return num_holders_.at(std::size_t(block)); }

 private:
  int64_t num_blocks_;
  int64_t block_size_;
  bool model_has_attention_;
  // A stack (top = back): lowest ids first in a fresh manager, then the most recently freed blocks.
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> num_holders_;  // [num_blocks] tables holding each block (0: free; freeing it again is caught)
};

}  // namespace jambo::engine
