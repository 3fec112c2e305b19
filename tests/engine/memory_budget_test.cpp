// Memory budgets: parsing bytes, units and fractions (and rejecting everything else, naming the
// value), and the split of a budget into state slots and KV blocks, checked against hand arithmetic.
#include "engine/memory_budget.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/kv_block_manager.h"

namespace jambo::engine {
namespace {

int64_t mem_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024;
  ADD_FAILURE() << "no MemAvailable in /proc/meminfo";
  return 0;
}

MemoryBudget bytes(int64_t count) { return {.bytes = count}; }
MemoryBudget fraction(double share) { return {.fraction = share}; }

TEST(ParseMemoryBudget, BytesAndUnits) {
  EXPECT_EQ(parse_memory_budget("8000000000"), bytes(8000000000));
  EXPECT_EQ(parse_memory_budget("8e9"), bytes(8000000000));
  EXPECT_EQ(parse_memory_budget("2"), bytes(2));
  EXPECT_EQ(parse_memory_budget("4KiB"), bytes(4096));
  EXPECT_EQ(parse_memory_budget("512MiB"), bytes(512 * 1048576));
  EXPECT_EQ(parse_memory_budget("2GiB"), bytes(2147483648));
  EXPECT_EQ(parse_memory_budget("1.5GiB"), bytes(1610612736));
  EXPECT_EQ(parse_memory_budget("0.5KiB"), bytes(512));
  EXPECT_EQ(parse_memory_budget("1TiB"), bytes(int64_t(1) << 40));
}

// Parsing reads no memory: a fraction stays a fraction until the engine resolves it on its backend.
TEST(ParseMemoryBudget, NumbersUpToOneAreFractions) {
  EXPECT_EQ(parse_memory_budget("1"), fraction(1));
  EXPECT_EQ(parse_memory_budget("0.25"), fraction(0.25));
  EXPECT_EQ(parse_memory_budget("1e-1"), fraction(0.1));
}

TEST(ParseMemoryBudget, PrintsAsTheFlagSpellsIt) {
  for (const std::string text : {"8000000000", "2", "0.25", "1"}) EXPECT_EQ(to_string(parse_memory_budget(text)), text);
  EXPECT_EQ(to_string(parse_memory_budget("2GiB")), "2147483648");
}

// MemAvailable moves a little between two reads, hence the tolerance.
TEST(ResolveMemoryBudget, FractionsOfAvailableMemory) {
  const double available = double(mem_available_bytes());
  ASSERT_GT(available, 0);
  EXPECT_NEAR(double(fraction(1).resolve(BackendKind::Cpu)), available, 0.05 * available);
  EXPECT_NEAR(double(fraction(0.25).resolve(BackendKind::Cpu)), 0.25 * available, 0.05 * available);
  EXPECT_EQ(bytes(8000000000).resolve(BackendKind::Cpu), 8000000000);
}

TEST(ParseMemoryBudget, RejectsAnythingElseNamingTheValue) {
  for (const std::string text : {"",    "abc",   "lots", "-1",   "0",     "0.0",  "1.5",  "nan", "inf",  "8e9x", "2GB",
                                 "2XB", "2 GiB", " 8e9", "0GiB", "-2GiB", "1e30", "1e19", "GiB", "8e9 ", "tight"}) {
    try {
      parse_memory_budget(text);
      ADD_FAILURE() << "memory budget '" << text << "' was accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("'" + text + "'"), std::string::npos) << error.what();
    }
  }
}

// tests/fixtures/models/moe-top2-gqa2-fp32: H = 32, L = 8, attention at layers 2 and 6 (period 4,
// offset 2), so 6 Mamba layers; Di = 2 * 32 = 64, K = 4, N = 16; nh = 4, hd = 8, nkv = 2.
//   bytes per slot      = 6 layers * 64 * (3 + 16) * 4 bytes          = 29184
//   bytes per KV block  = 2 layers * 2 * 16 tokens * 2 * 8 * 4 bytes  = 4096 (block size 16)
// With max_model_len 100 one request needs ceil(100 / 16) = 7 blocks, so 29184 + 7 * 4096 = 57856
// bytes besides the weights.
class PlanCache : public ::testing::Test {
 protected:
  static constexpr int64_t kWeights = 100000;
  static constexpr int64_t kOneRequest = 57856;
  model::JambaConfig config_ =
      model::load_config(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/moe-top2-gqa2-fp32/config.json");

  CachePlan plan(int64_t budget, int64_t max_num_seqs = 4) {
    return plan_cache(config_, kWeights, budget, max_num_seqs, 16, 100, DType::F32);
  }
};

TEST_F(PlanCache, BytesPerSlotAndBlock) {
  const CachePlan result = plan(10000000);
  EXPECT_EQ(result.bytes_per_slot, 29184);
  EXPECT_EQ(result.bytes_per_kv_block, 4096);
  EXPECT_EQ(result.weight_bytes, kWeights);
  EXPECT_EQ(result.cache.kv_block_size, 16);
}

// A bf16 state halves the slot (14592 bytes), so the budget of 2 fp32 slots above holds 4; the plan carries the type.
TEST_F(PlanCache, Bf16StateHalvesTheSlot) {
  const CachePlan result = plan_cache(config_, kWeights, kWeights + 92040, 4, 16, 100, DType::BF16);
  EXPECT_EQ(result.bytes_per_slot, 14592);
  EXPECT_EQ(result.cache.num_state_slots, 4);
  EXPECT_EQ(result.cache.state_dtype, DType::BF16);
  EXPECT_EQ(exact_memory_budget(config_, kWeights, 3, 5, 16, DType::BF16), kWeights + 3 * 14592 + 5 * 4096);
}

TEST_F(PlanCache, ExactlyOneRequest) {
  const CachePlan result = plan(kWeights + kOneRequest);
  EXPECT_EQ(result.cache.num_state_slots, 1);
  EXPECT_EQ(result.cache.num_kv_blocks, 7);
}

// 2 * 29184 + 7 * 4096 + 5000 = 92040 bytes for caches: (92040 - 28672) / 29184 = 2 slots, then
// (92040 - 58368) / 4096 = 8 blocks.
TEST_F(PlanCache, SlotsLimitedByTheBudget) {
  const CachePlan result = plan(kWeights + 92040);
  EXPECT_EQ(result.cache.num_state_slots, 2);
  EXPECT_EQ(result.cache.num_kv_blocks, 8);
}

// 4 * 29184 + 10 * 4096 = 157696 bytes for caches: 4 slots (max_num_seqs), 10 blocks.
TEST_F(PlanCache, SlotsLimitedByMaxNumSeqs) {
  const CachePlan result = plan(kWeights + 157696);
  EXPECT_EQ(result.cache.num_state_slots, 4);
  EXPECT_EQ(result.cache.num_kv_blocks, 10);
}

// A huge budget stops at what 4 sequences of 100 tokens can use: 4 * 7 blocks.
TEST_F(PlanCache, BlocksCappedAtWhatTheSequencesCanUse) {
  const CachePlan result = plan(int64_t(1) << 40);
  EXPECT_EQ(result.cache.num_state_slots, 4);
  EXPECT_EQ(result.cache.num_kv_blocks, 28);
}

TEST_F(PlanCache, ErrorWhenOneRequestDoesNotFit) {
  for (const int64_t budget : {kWeights + kOneRequest - 1, kWeights / 2}) {
    try {
      plan(budget);
      ADD_FAILURE() << "budget " << budget << " was accepted";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(std::to_string(budget) + " bytes"), std::string::npos) << message;
      EXPECT_NE(message.find(std::to_string(kWeights + kOneRequest) + " bytes"), std::string::npos) << message;
      EXPECT_NE(message.find("max_model_len 100"), std::string::npos) << message;
    }
  }
}

TEST_F(PlanCache, RejectsBadLimits) {
  EXPECT_THROW(plan_cache(config_, kWeights, 1 << 30, 0, 16, 100, DType::F32), Error);
  EXPECT_THROW(plan_cache(config_, kWeights, 1 << 30, 4, 0, 100, DType::F32), Error);
  EXPECT_THROW(plan_cache(config_, kWeights, 1 << 30, 4, 16, 0, DType::F32), Error);
  EXPECT_THROW(plan_cache(config_, kWeights, 1 << 30, 4, 16, 100, DType::F16), Error);
  EXPECT_THROW(plan_cache(config_, kWeights, 1 << 30, 4, 1, int64_t(1) << 40, DType::F32), Error);
}

// Moving the attention period past the last layer leaves 8 Mamba layers: 8 * 64 * 19 * 4 = 38912
// bytes per slot and no KV blocks at all.
TEST_F(PlanCache, ModelWithoutAttentionGetsNoBlocks) {
  config_.attn_layer_period = 16;
  config_.attn_layer_offset = 9;
  config_.finalize("test config");
  ASSERT_EQ(config_.num_attention_layers(), 0);
  const CachePlan result = plan(kWeights + 3 * 38912);
  EXPECT_EQ(result.bytes_per_slot, 38912);
  EXPECT_EQ(result.bytes_per_kv_block, 0);
  EXPECT_EQ(result.cache.num_state_slots, 3);
  EXPECT_EQ(result.cache.num_kv_blocks, 0);
  const KvBlockManager manager(result.cache.num_kv_blocks, 16, config_.num_attention_layers() > 0);
  EXPECT_EQ(manager.blocks_for(100), 0);
}

}  // namespace
}  // namespace jambo::engine
