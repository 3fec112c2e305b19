// The KV block manager: block counts per token count, growing and freeing tables, the edges of
// can_grow, blocks shared between tables (a request's samples share its prompt's full blocks), and models
// without attention layers (which need no blocks at all).
#include "engine/kv_block_manager.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"

namespace jambo::engine {
namespace {

using Table = std::vector<int32_t>;

TEST(KvBlockManager, BlocksForRoundsUpToWholeBlocks) {
  const KvBlockManager manager(8, 16, true);
  EXPECT_EQ(manager.blocks_for(0), 0);
  EXPECT_EQ(manager.blocks_for(1), 1);
  EXPECT_EQ(manager.blocks_for(16), 1);
  EXPECT_EQ(manager.blocks_for(17), 2);
  EXPECT_EQ(manager.blocks_for(128), 8);
  EXPECT_THROW(manager.blocks_for(-1), Error);
}

TEST(KvBlockManager, RejectsBadSizes) {
  EXPECT_THROW(KvBlockManager(8, 0, true), Error);
  EXPECT_THROW(KvBlockManager(-1, 16, true), Error);
  EXPECT_THROW(KvBlockManager(int64_t(1) << 31, 16, true), Error);
}

TEST(KvBlockManager, GrowAppendsOnlyTheMissingBlocks) {
  KvBlockManager manager(4, 16, true);
  Table table;
  manager.grow(table, 17);
  EXPECT_EQ(table, (Table{0, 1}));
  manager.grow(table, 32);  // still fits in two blocks
  EXPECT_EQ(table, (Table{0, 1}));
  manager.grow(table, 33);
  EXPECT_EQ(table, (Table{0, 1, 2}));
  manager.grow(table, 5);  // never shrinks
  EXPECT_EQ(table, (Table{0, 1, 2}));
  EXPECT_EQ(manager.num_used(), 3);
  EXPECT_EQ(manager.num_free(), 1);
}

TEST(KvBlockManager, CanGrowUpToTheLastFreeBlockExactly) {
  KvBlockManager manager(4, 16, true);
  Table table;
  EXPECT_TRUE(manager.can_grow(table, 64));
  EXPECT_FALSE(manager.can_grow(table, 65));
  manager.grow(table, 40);  // 3 blocks, 1 free
  EXPECT_TRUE(manager.can_grow(table, 64));
  EXPECT_FALSE(manager.can_grow(table, 65));
  EXPECT_TRUE(manager.can_grow(table, 1));  // a table that already holds the tokens needs nothing

  EXPECT_THROW(manager.grow(table, 65), Error);
  EXPECT_EQ(table, (Table{0, 1, 2}));  // a refused grow changes nothing
  EXPECT_EQ(manager.num_free(), 1);

  Table other;
  manager.grow(other, 16);
  EXPECT_EQ(other, (Table{3}));
  EXPECT_FALSE(manager.can_grow(other, 17));
  EXPECT_TRUE(manager.can_grow(other, 16));
}

TEST(KvBlockManager, FreeReturnsEveryBlockForReuse) {
  KvBlockManager manager(6, 4, true);
  Table first, second;
  manager.grow(first, 9);    // 3 blocks
  manager.grow(second, 12);  // 3 blocks
  std::set<int32_t> all(first.begin(), first.end());
  all.insert(second.begin(), second.end());
  EXPECT_EQ(all.size(), 6u);  // tables never share a block
  const Table freed = first;
  manager.free(first);
  EXPECT_TRUE(first.empty());
  EXPECT_EQ(manager.num_free(), 3);
  Table third;
  manager.grow(third, 12);
  EXPECT_EQ(third, freed);  // the freed blocks, first block first
  EXPECT_EQ(manager.num_free(), 0);
}

TEST(KvBlockManager, FreeingABlockTwiceIsAnError) {
  KvBlockManager manager(4, 16, true);
  Table table;
  manager.grow(table, 20);
  Table copy = table;
  manager.free(table);
  try {
    manager.free(copy);
    ADD_FAILURE() << "a second free of the same blocks was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("KV block 1"), std::string::npos) << error.what();
  }
  Table foreign = {7};
  EXPECT_THROW(manager.free(foreign), Error);
}

TEST(KvBlockManager, ModelsWithoutAttentionNeedNoBlocks) {
  KvBlockManager manager(0, 16, false);
  Table table;
  EXPECT_EQ(manager.blocks_for(100000), 0);
  EXPECT_TRUE(manager.can_grow(table, 100000));
  manager.grow(table, 100000);
  EXPECT_TRUE(table.empty());
  manager.free(table);
  EXPECT_EQ(manager.num_free(), 0);
  EXPECT_EQ(manager.num_used(), 0);
}

TEST(KvBlockManager, AttentionModelWithoutBlocksCannotGrow) {
  KvBlockManager manager(0, 16, true);
  Table table;
  EXPECT_TRUE(manager.can_grow(table, 0));
  EXPECT_FALSE(manager.can_grow(table, 1));
  EXPECT_THROW(manager.grow(table, 1), Error);
}

TEST(KvBlockManager, FullBlocksCountOnlyWhollyFilledOnes) {
  const KvBlockManager manager(8, 16, true), no_attention(0, 16, false);
  EXPECT_EQ(manager.full_blocks(0), 0);
  EXPECT_EQ(manager.full_blocks(15), 0);
  EXPECT_EQ(manager.full_blocks(16), 1);
  EXPECT_EQ(manager.full_blocks(40), 2);
  EXPECT_EQ(no_attention.full_blocks(40), 0);
  EXPECT_THROW(manager.full_blocks(-1), Error);
}

// A shared block stays in use until its last holder frees it, and is then free once (not once per holder).
TEST(KvBlockManager, SharedBlocksAreFreeOnlyAfterTheirLastHolder) {
  KvBlockManager manager(6, 4, true);
  Table leader, sample, other;
  manager.grow(leader, 10);  // blocks 0, 1 full, 2 partial
  manager.share(leader, manager.full_blocks(10), sample);
  manager.grow(sample, 10);  // its own partial block
  EXPECT_EQ(sample, (Table{0, 1, 3}));
  EXPECT_EQ(manager.num_used(), 4);
  EXPECT_THROW(manager.share(leader, 1, sample), Error);  // into a table that is not empty
  EXPECT_THROW(manager.share(leader, 4, other), Error);   // more blocks than the table has

  manager.free(leader);
  EXPECT_EQ(manager.num_used(), 3);  // blocks 0 and 1 still held by the sample, and its own 3
  manager.grow(other, 8);
  EXPECT_EQ(other, (Table{2, 4}));  // never a block the sample holds
  manager.free(sample);
  manager.free(other);
  EXPECT_EQ(manager.num_free(), 6);
  Table stale = {0};
  EXPECT_THROW(manager.free(stale), Error);                // freed once per holder, then no more
  EXPECT_THROW(manager.share(Table{1}, 1, other), Error);  // a free block cannot be shared
}

}  // namespace
}  // namespace jambo::engine
