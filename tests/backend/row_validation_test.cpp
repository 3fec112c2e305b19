// Law 2's check on the KV cache, straight on validate_rows: a block a step writes belongs to its row alone, while
// blocks only read (a shared prompt prefix) may appear in many rows.
#include "backend/row_validation.h"

#include "core/error.h"
#include "model/config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace jambo::backend {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr TokenChoice kGreedy{};

// Decode rows at position 40 (blocks 0-1 read, block 2 written), each with its own table.
class KvWritesTest : public ::testing::Test {
 protected:
  void SetUp() override { config_.finalize("test"); }

  void add_row(std::vector<int32_t> table) {
    tables_.push_back(std::move(table));
    tokens_.push_back({7});
  }

  std::vector<BatchRow> rows() const {
    std::vector<BatchRow> out(tables_.size());
    for (size_t r = 0; r < out.size(); ++r) {
      out[r].sequence_id = int64_t(100 + r);
      out[r].tokens = tokens_[r];
      out[r].start_position = 40;
      out[r].has_initial_state = true;
      out[r].slot = int64_t(r);
      out[r].block_table = tables_[r];
      out[r].choices = std::span(&kGreedy, 1);
    }
    return out;
  }

  // Block ids past 2^16 are in range, so that ids sharing their low 16 bits can meet.
  CacheExtent extent() const { return {int64_t(tables_.size()), 4 * 65536, kBlockSize}; }

  model::JambaConfig config_;  // Jamba-v0.1's: it has attention layers
  std::vector<std::vector<int32_t>> tables_, tokens_;
};

TEST_F(KvWritesTest, RowsSharingOnlyTheBlocksTheyReadAreAccepted) {
  for (int32_t r = 0; r < 64; ++r) add_row({1, 2, 1000 + r});  // one shared prefix, written blocks apart
  EXPECT_NO_THROW(validate_rows(rows(), config_, extent()));
}

// A row reading a block whose id has the written block's low 16 bits is no conflict.
TEST_F(KvWritesTest, BlocksThatShareTheirLow16BitsAreDistinct) {
  add_row({5, 6, 7});
  add_row({5 + 65536, 7 + 65536, 9});
  add_row({7 + 2 * 65536, 6 + 65536, 10});
  EXPECT_NO_THROW(validate_rows(rows(), config_, extent()));
}

TEST_F(KvWritesTest, ARowReadingABlockAnotherRowWritesIsRejected) {
  add_row({1, 2, 3});
  add_row({3, 4, 5});  // reads block 3, which the first row writes
  try {
    validate_rows(rows(), config_, extent());
    ADD_FAILURE() << "a row reading a block written in the same step was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("sequence 101: KV block 3 is written by sequence 100"), std::string::npos)
        << error.what();
  }
}

TEST_F(KvWritesTest, TwoRowsWritingOneBlockAreRejected) {
  add_row({1, 2, 3 + 65536});
  add_row({4, 5, 3 + 65536});
  EXPECT_THROW(validate_rows(rows(), config_, extent()), Error);
}

}  // namespace
}  // namespace jambo::backend
