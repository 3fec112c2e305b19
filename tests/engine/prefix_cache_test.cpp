// Prefix caching (engine/prefix_cache.h): a request that resumes from a cached prefix gives the same bits as the same
// request run cold, alone, on a fresh engine; the cache finds the deepest boundary holding both a checkpoint and
// every KV block before it, compares tokens (not only hashes), saves checkpoints at a prompt's end and where it
// leaves a cached prefix, evicts least recently used checkpoints and KV blocks when pressed, poisons what it evicts
// in checked mode, empties itself on new weights and a sleep, and counts every query's hit or the reason it missed.
#include "support/engine_test_util.h"
#include "support/prefix_requests.h"
#include "engine/prefix_cache.h"
#include "forensics/trace_reader.h"

#include <gtest/gtest.h>

namespace jambo::engine {
namespace {

constexpr int64_t kBlock = 16;

using testing::concat;
using testing::prefix_request;
using testing::random_tokens;

// Checked mode, exactly these slots, KV blocks and checkpoints (the checkpoints taken before the KV blocks).
EngineOptions caching_options(const model::Model& model, int64_t max_num_seqs, int64_t num_kv_blocks,
                              int64_t num_checkpoints) {
  EngineOptions options = testing::exact_engine_options(model, max_num_seqs, num_kv_blocks, kBlock, 128);
  options.max_num_batched_tokens = 24;  // prompts in chunks, so checkpoints fall inside and at the end of steps
  options.max_num_checkpoints = num_checkpoints;
  options.memory_budget.bytes += num_checkpoints * state_elements_per_slot(model.config) * int64_t(sizeof(float));
  return options;
}

struct CachingEngine {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  Engine engine;
  explicit CachingEngine(int64_t num_checkpoints = 8, int64_t num_kv_blocks = 256, int64_t max_num_seqs = 8)
      : engine(model, nullptr, caching_options(model, max_num_seqs, num_kv_blocks, num_checkpoints)) {}

  testing::Outputs run(const std::vector<RequestSpec>& specs) { return testing::run_to_end(engine, specs); }
  const PrefixCacheCounters& cache() const { return engine.counters().prefix_cache; }
  int64_t misses(PrefixMiss miss) const { return cache().misses[int(miss)]; }
};

TEST(PrefixCaching, IsOnWithCheckpointsAndSaysSo) {
  CachingEngine c;
  EXPECT_EQ(c.engine.prefix_caching_status(), "on (8 checkpoints of 28.5 KiB, 16-token blocks)");
  EXPECT_TRUE(c.engine.counters().prefix_caching);
  EXPECT_EQ(c.cache().checkpoints_total, 8);
}

// A second request sharing 40 tokens resumes past the 32 of them held by full blocks, from the checkpoint the first
// saved at its prompt's last block boundary, and gives the cold run's bits.
TEST(PrefixCaching, ASharedPrefixResumesBitwiseAsTheColdRun) {
  CachingEngine c;
  const std::vector<int32_t> prefix = random_tokens(c.model, 40, 1);
  const RequestSpec first = prefix_request("first", concat(prefix, random_tokens(c.model, 5, 2)), 6);
  const RequestSpec second = prefix_request("second", concat(prefix, random_tokens(c.model, 9, 3)), 8, 8);
  const RequestSpec third = prefix_request("third", concat(prefix, random_tokens(c.model, 3, 4)), 5, 9);
  testing::expect_bitwise_equal(testing::run_alone(c.model, {first}), c.run({first}));
  EXPECT_EQ(c.cache().hit_tokens, 0);
  EXPECT_EQ(c.misses(PrefixMiss::NoCheckpoint), 1);
  EXPECT_EQ(c.cache().checkpoints_used, 2);  // at 32, the prompt's last block boundary, and at 48, the output's

  testing::expect_bitwise_equal(testing::run_alone(c.model, {second, third}), c.run({second, third}));
  EXPECT_EQ(c.cache().hit_tokens, 64);
  EXPECT_EQ(c.cache().query_tokens, 45 + 49 + 43);
  EXPECT_EQ(c.engine.counters().kv_blocks_used + c.engine.counters().slots_used, 0);
  EXPECT_EQ(c.engine.counters().law_violations, 0);
}

// Multi-turn chat: the next turn sends the whole conversation again, the previous output included, and resumes from
// the checkpoint at the last block boundary the previous turn computed: 50 prompt tokens and 29 of its 30 generated
// ones (the last is never run) reach 64. Each sequence keeps one checkpoint past its prompt, the latest.
TEST(PrefixCaching, TheNextTurnResumesAfterThePreviousOutput) {
  CachingEngine c;
  const RequestSpec turn1 = prefix_request("turn1", random_tokens(c.model, 50, 5), 30);
  const testing::Outputs first = c.run({turn1});
  EXPECT_EQ(c.cache().checkpoints_used, 2);  // at 48 (the prompt's last block boundary) and at 64 (the output's)
  const std::vector<int32_t> history = concat(turn1.prompt_ids, first.at({"turn1", 0}).ids);
  const RequestSpec turn2 = prefix_request("turn2", concat(history, random_tokens(c.model, 20, 6)), 20);
  testing::expect_bitwise_equal(testing::run_alone(c.model, {turn2}), c.run({turn2}));
  EXPECT_EQ(c.cache().hit_tokens, 64);
  EXPECT_EQ(c.cache().checkpoints_used, 4);  // and turn 2's at 96 (its prompt's) and 112 (its output's)
}

// Past its prompt a sequence keeps one checkpoint, the latest: 20 prompt tokens and 59 generated ones run pass the
// boundaries 16 (the prompt's), 32, 48 and 64; 32 and 48 are replaced as the next is saved.
TEST(PrefixCaching, ASequenceKeepsOneCheckpointPastItsPrompt) {
  CachingEngine c;
  const RequestSpec spec = prefix_request("long", random_tokens(c.model, 20, 81), 60);
  const testing::Outputs outputs = c.run({spec});
  EXPECT_EQ(c.cache().checkpoints_used, 2);
  EXPECT_EQ(c.cache().checkpoint_evictions, 0);
  const std::vector<int32_t> history = concat(spec.prompt_ids, outputs.at({"long", 0}).ids);
  const RequestSpec next = prefix_request("next", concat(history, {3, 4}), 4);
  testing::expect_bitwise_equal(testing::run_alone(c.model, {next}), c.run({next}));
  EXPECT_EQ(c.cache().hit_tokens, 64);
}

// Where a prompt leaves a cached prefix (its KV blocks cached, no checkpoint there), its prefill saves a checkpoint
// at that branch point: the next request with that prefix resumes there.
TEST(PrefixCaching, ACheckpointIsSavedWhereAPromptLeavesACachedPrefix) {
  CachingEngine c;
  const std::vector<int32_t> system = random_tokens(c.model, 40, 11);
  const RequestSpec a = prefix_request("a", concat(system, random_tokens(c.model, 30, 12)), 3);
  const RequestSpec b = prefix_request("b", concat(system, random_tokens(c.model, 30, 13)), 3);
  const RequestSpec d = prefix_request("d", concat(system, random_tokens(c.model, 30, 14)), 3);
  c.run({a});
  c.run({b});
  EXPECT_EQ(c.cache().hit_tokens, 0);  // a saved at 64, under its own tokens; b finds blocks 0-1 but no state at 32
  EXPECT_EQ(c.misses(PrefixMiss::NoCheckpoint), 2);
  testing::expect_bitwise_equal(testing::run_alone(c.model, {d}), c.run({d}));
  EXPECT_EQ(c.cache().hit_tokens, 32);
}

// The tokens decide, not the hash of a block alone: a prompt that differs in one token of its second block resumes
// after the first block only, and a prompt of fewer than a block and a token never resumes.
TEST(PrefixCaching, OneDifferentTokenEndsTheMatchAndShortPromptsMiss) {
  CachingEngine c;
  const std::vector<int32_t> prompt = random_tokens(c.model, 40, 21);
  const std::vector<int32_t> first20(prompt.begin(), prompt.begin() + 20);
  c.run({prefix_request("a", prompt, 2), prefix_request("b", first20, 2)});
  std::vector<int32_t> changed = prompt;
  changed[20] = (changed[20] + 1) % int32_t(c.model.config.vocab_size);
  const RequestSpec other = prefix_request("other", changed, 4);
  testing::expect_bitwise_equal(testing::run_alone(c.model, {other}), c.run({other}));
  EXPECT_EQ(c.cache().hit_tokens, 16);  // b's checkpoint at 16; a's at 32 lies past the changed token
  const RequestSpec short_one = prefix_request("short", std::vector<int32_t>(prompt.begin(), prompt.begin() + 16), 2);
  c.run({short_one});
  EXPECT_EQ(c.misses(PrefixMiss::BelowOneBlock), 1);  // its last token must run: nothing before it is a block
}

// New weights (or only a new name for them) empty the cache: the same prompt misses, for that reason.
TEST(PrefixCaching, NewWeightsEmptyTheCache) {
  CachingEngine c;
  const RequestSpec spec = prefix_request("a", random_tokens(c.model, 40, 31), 3);
  c.run({spec});
  EXPECT_EQ(c.cache().checkpoints_used, 1);
  c.engine.set_weight_version("step-1");
  EXPECT_EQ(c.cache().checkpoints_used, 0);
  EXPECT_EQ(c.cache().cached_kv_blocks, 0);
  RequestSpec again = spec;
  again.id = "again";
  c.run({again});
  EXPECT_EQ(c.cache().hit_tokens, 0);
  EXPECT_EQ(c.misses(PrefixMiss::WeightVersion), 1);
  c.engine.reset_prefix_cache();
  EXPECT_EQ(c.cache().checkpoints_used + c.cache().cached_kv_blocks, 0);
}

// --trace names the checkpoint a request resumed from and the tokens it skipped; jambo trace shows them.
TEST(PrefixCaching, TheTraceNamesTheCheckpointARequestResumedFrom) {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  testing::TestTraceFile trace;
  EngineOptions options = caching_options(model, 8, 256, 8);
  options.trace_path = trace.path();
  const std::vector<int32_t> prefix = random_tokens(model, 40, 71);
  {
    Engine engine(model, nullptr, options);
    testing::run_to_end(engine, {prefix_request("first", prefix, 2)});
    testing::run_to_end(engine, {prefix_request("second", concat(prefix, {5, 6}), 2)});
  }
  std::ifstream file(trace.path());
  const forensics::RequestLife life = forensics::read_request_life(file, "second");
  const auto admitted = std::find_if(life.lines.begin(), life.lines.end(),
                                     [](const std::string& line) { return line.find("admitted") != std::string::npos; });
  ASSERT_NE(admitted, life.lines.end());
  EXPECT_NE(admitted->find("cached_tokens=32"), std::string::npos) << *admitted;
  EXPECT_NE(admitted->find("checkpoint_slot=8"), std::string::npos) << *admitted;  // the first, after 8 slots
  EXPECT_NE(admitted->find("checkpoint_generation=1"), std::string::npos) << *admitted;
}

// A sleep lets the caches' memory go: the cache empties first, and a later miss says the entry was evicted.
TEST(PrefixCaching, ASleepEmptiesTheCache) {
  CachingEngine c;
  const RequestSpec spec = prefix_request("a", random_tokens(c.model, 40, 41), 3);
  c.run({spec});
  c.engine.sleep(backend::SleepLevel::KeepWeights);
  c.engine.wake_up({.weights = true, .caches = true});
  RequestSpec again = spec;
  again.id = "again";
  testing::expect_bitwise_equal(testing::run_alone(c.model, {again}), c.run({again}));
  EXPECT_EQ(c.misses(PrefixMiss::Evicted), 1);
}

// Many requests over a few shared prefixes, with n > 1 forks, prompt logprobs, two checkpoints and too few KV blocks
// for everyone: checkpoints and cached blocks are evicted all the time, requests are preempted, and every request
// still gives its cold run's bits (checked mode: every checkpoint's owner and generation verified, evicted ones
// poisoned with NaN).
TEST(PrefixCaching, UnderEvictionAndPreemptionEveryRequestIsItsColdRun) {
  CachingEngine c(/*num_checkpoints=*/2, /*num_kv_blocks=*/12, /*max_num_seqs=*/6);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 3; ++p) prefixes.push_back(random_tokens(c.model, 20 + 14 * p, 50 + p));
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 24; ++i) {
    const std::vector<int32_t> prompt = concat(prefixes[i % 3], random_tokens(c.model, 1 + i % 13, 100 + i));
    RequestSpec spec = prefix_request(fmt::format("r{}", i), prompt, 4 + i % 9, uint64_t(200 + i));
    if (i % 5 == 2) spec.n = 2;
    if (i % 7 == 3) spec.num_prompt_logprobs = 1;
    specs.push_back(spec);
  }
  testing::expect_bitwise_equal(testing::run_alone(c.model, specs), c.run(specs));
  const EngineCounters& counters = c.engine.counters();
  EXPECT_GT(c.cache().hit_tokens, 0);
  EXPECT_GT(c.cache().checkpoint_evictions, 0);
  EXPECT_GT(counters.preemptions, 0);
  EXPECT_EQ(counters.law_violations, 0);
  EXPECT_EQ(counters.kv_blocks_used + counters.slots_used, 0);
}

// Eviction in the very step a request resumes never frees its checkpoint before the copy: with a pool of one, a
// request admitted first in the same step saves a checkpoint at 16 and so evicts the only one, at 32, that the second
// resumes from. The copy into the second's own slot is made at its admission, before the step reserves checkpoints
// (checked mode poisons the evicted one with NaN and verifies its owner and generation before any copy).
TEST(PrefixCaching, EvictionInTheStepARequestResumesFreesItsCheckpointOnlyAfterTheCopy) {
  CachingEngine c(/*num_checkpoints=*/1);
  const std::vector<int32_t> prefix = random_tokens(c.model, 40, 91);
  c.run({prefix_request("first", prefix, 3)});
  EXPECT_EQ(c.cache().checkpoints_used, 1);
  const RequestSpec evictor = prefix_request("evictor", random_tokens(c.model, 20, 92), 4);
  const RequestSpec resumer = prefix_request("resumer", concat(prefix, random_tokens(c.model, 9, 93)), 6, 5);
  testing::expect_bitwise_equal(testing::run_alone(c.model, {evictor, resumer}), c.run({evictor, resumer}));
  EXPECT_EQ(c.cache().hit_tokens, 32);
  EXPECT_GE(c.cache().checkpoint_evictions, 1);
  EXPECT_EQ(c.engine.counters().law_violations, 0);
}

// The cache alone: least recently used checkpoints go first and their leases end (law 2); cached KV blocks that no
// table holds are freed on demand, from the leaves.
TEST(PrefixCacheUnit, EvictsTheLeastRecentlyUsedAndEndsItsLease) {
  KvBlockManager kv_blocks(8, 4, /*model_has_attention=*/true);
  std::vector<int64_t> freed;
  PrefixCache cache(4, true, true, kv_blocks, /*num_checkpoints=*/2, /*first_checkpoint_slot=*/10,
                    [&](int64_t slot) { freed.push_back(slot); });
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b = {1, 2, 3, 4, 9, 9, 9, 9, 9};
  std::vector<int32_t> table_a, table_b;
  kv_blocks.grow(table_a, 9);
  kv_blocks.grow(table_b, 9);
  const CheckpointLease at_a = *cache.reserve_checkpoint();
  cache.insert(a, 8, table_a, at_a);
  const CheckpointLease at_b = *cache.reserve_checkpoint();
  cache.insert(b, 4, table_b, at_b);  // b's first block is a's: kept as it is, with this checkpoint at 4
  EXPECT_EQ(cache.match(a, 9, 8).num_tokens, 8);
  EXPECT_EQ(cache.match(b, 9, 8).num_tokens, 4);
  EXPECT_EQ(cache.match(b, 9, 8).kv_blocks, std::vector<int32_t>{table_a[0]});
  cache.count(cache.match(a, 9, 8), 9);  // a's entries are now the most recently used

  const CheckpointLease third = *cache.reserve_checkpoint();  // evicts b's checkpoint at 4
  EXPECT_FALSE(cache.holds(at_b));
  EXPECT_TRUE(cache.holds(at_a));
  EXPECT_EQ(freed, std::vector<int64_t>{at_b.backend_slot});
  EXPECT_EQ(third.backend_slot, at_b.backend_slot);
  EXPECT_NE(third.lease.generation, at_b.lease.generation);
  EXPECT_EQ(cache.match(b, 9, 8).miss, PrefixMiss::Evicted);
  cache.release_checkpoint(third);

  kv_blocks.free(table_a);
  kv_blocks.free(table_b);
  EXPECT_EQ(kv_blocks.num_free(), 8 - 2);  // a's two blocks, held by the cache
  EXPECT_TRUE(cache.make_free_blocks(8));
  EXPECT_EQ(cache.counters().cached_kv_blocks, 0);
  EXPECT_EQ(cache.match(a, 9, 8).num_tokens, 0);
}

// The CPU backend writes a checkpoint from inside a step: the state after 16 of a row's 21 tokens is the state of a
// row that stops there.
TEST(PrefixCacheBackend, ACheckpointInsideAStepIsTheStateOfAStepThatEndsThere) {
  testing::OneThread one_thread;
  const model::Model model = testing::load_fixture_model();
  backend::CacheConfig cache;
  cache.num_state_slots = 2;
  cache.num_kv_blocks = 8;
  cache.num_checkpoints = 1;
  std::unique_ptr<backend::Backend> backend = backend::cpu::make_cpu_backend(model, cache);
  const std::vector<int32_t> tokens = random_tokens(model, 21, 61);
  const std::vector<int32_t> table_a = {0, 1}, table_b = {2, 3};
  const backend::StateCheckpoint checkpoint{16, 2};
  backend::BatchRow whole = backend::sequence_row(0, tokens, 0, 21, 0, table_a, kBlock);
  whole.checkpoints = std::span(&checkpoint, 1);
  backend::StepOutput output;
  backend->forward(std::span(&whole, 1), output);
  const backend::BatchRow first16 = backend::sequence_row(1, tokens, 0, 16, 1, table_b, kBlock);
  backend->forward(std::span(&first16, 1), output);
  // Both continue with the same 5 tokens from their own state: the checkpoint's copy and the stopped row's.
  backend->copy_state(2, 0);
  backend::BatchRow from_checkpoint = backend::sequence_row(0, tokens, 16, 5, 0, table_a, kBlock);
  backend::BatchRow from_stop = backend::sequence_row(1, tokens, 16, 5, 1, table_b, kBlock);
  from_checkpoint.copy_logits = from_stop.copy_logits = backend::LogitsCopy::All;
  const backend::BatchRow rows[] = {from_checkpoint, from_stop};
  backend->forward(rows, output);
  const std::span<const float> all = output.values;
  const size_t half = all.size() / 2;
  EXPECT_TRUE(std::equal(all.begin(), all.begin() + long(half), all.begin() + long(half)));
}

}  // namespace
}  // namespace jambo::engine
