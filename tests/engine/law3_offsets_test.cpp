// DESIGN.md law 3 at the engine level: the slot pool's `highest` policy hands a request the top slot
// of a pool larger than 2^32 fp32 elements (reserved without backing, so only touched pages cost
// memory), and the request's logits there are bitwise those it gets in slot 0. The pool is sized so
// that a 32-bit wrap of the top slot's offset would land inside slot 0, where another request's state
// lives during the same steps: any wrap corrupts one of the two.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/tensor.h"
#include "engine/slot_pool.h"
#include "model/weights.h"

namespace jambo::engine {
namespace {

constexpr int64_t kTwoTo32 = int64_t(1) << 32;
constexpr int64_t kBlockSize = 4;
constexpr int64_t kBlocksPerSequence = 8;
constexpr int64_t kPromptLength = 12;
constexpr int64_t kNumDecodeSteps = 6;

using StepLogitsList = std::vector<std::vector<float>>;  // [num_steps][V] last-token logits per step

// One request: a prompt prefilled in one step, then teacher-forced decode steps of one token.
struct Request {
  int64_t id = 0;
  int64_t slot = 0;
  std::vector<int32_t> tokens;       // [kPromptLength + kNumDecodeSteps]
  std::vector<int32_t> block_table;  // [kBlocksPerSequence]
  int64_t num_computed = 0;
  StepLogitsList logits;

  Request(int64_t request_id, int64_t state_slot, int32_t first_block, int64_t vocab_size, uint64_t seed)
      : id(request_id), slot(state_slot), block_table(kBlocksPerSequence) {
    std::iota(block_table.begin(), block_table.end(), first_block);
    std::mt19937_64 random(seed);
    for (int64_t i = 0; i < kPromptLength + kNumDecodeSteps; ++i) tokens.push_back(int32_t(random() % vocab_size));
  }

  backend::BatchRow next_row() const {
    const int64_t num_tokens = num_computed == 0 ? kPromptLength : 1;
    backend::BatchRow row;
    row.sequence_id = id;
    row.tokens = std::span<const int32_t>(tokens).subspan(num_computed, num_tokens);
    row.start_position = num_computed;
    row.has_initial_state = num_computed > 0;
    row.slot = slot;
    row.block_table = block_table;
    row.copy_logits = backend::LogitsCopy::Last;
    return row;
  }
};

// Steps the requests together (one row each) from prefill to their last decode token.
void run_together(backend::Backend& backend, std::vector<Request*> requests) {
  for (int64_t step = 0; step <= kNumDecodeSteps; ++step) {
    std::vector<backend::BatchRow> rows;
    for (const Request* request : requests) rows.push_back(request->next_row());
    backend::StepOutput logits;
    backend.forward(rows, logits);
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i]->num_computed += int64_t(rows[i].tokens.size());
      const std::span<const float> row_logits = logits.logits(int64_t(i));
      requests[i]->logits.emplace_back(row_logits.begin(), row_logits.end());
    }
  }
}

void expect_bitwise_equal(const StepLogitsList& actual, const StepLogitsList& expected, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t step = 0; step < actual.size(); ++step) {
    ASSERT_EQ(actual[step].size(), expected[step].size()) << what;
    EXPECT_EQ(std::memcmp(actual[step].data(), expected[step].data(), actual[step].size() * sizeof(float)), 0)
        << what << ": logits differ at step " << step;
  }
}

TEST(Law3Offsets, StateBeyondTwoToThe32ElementsGivesTheLogitsOfSlotZero) {
  const model::Model model =
      model::load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/moe-top2-gqa2-fp32");
  const model::JambaConfig& config = model.config;
  // A slot holds the conv tail [Di, K-1] and SSM state [Di, N] of every Mamba layer.
  const int64_t slot_elements =
      config.num_mamba_layers() * config.mamba_d_inner * (config.mamba_d_conv - 1 + config.mamba_d_state);
  const int64_t top_slot = (kTwoTo32 + slot_elements - 1) / slot_elements;  // first slot starting at >= 2^32
  const backend::CacheConfig cache{top_slot + 1, 2 * kBlocksPerSequence, kBlockSize};
  const std::unique_ptr<backend::Backend> backend = backend::cpu::make_cpu_backend(model, cache);

  SlotPool pool(cache.num_state_slots, SlotPolicy::Highest);
  const SlotLease lease = pool.allocate(1);
  ASSERT_EQ(lease.slot, top_slot);
  const int64_t top_offset = element_offset(lease.slot, slot_elements);
  ASSERT_GT(top_offset, kTwoTo32);
  ASSERT_LT(top_offset % kTwoTo32, slot_elements);  // wrapped, it would point into slot 0

  Request alone_in_slot_zero(1, 0, 0, config.vocab_size, 11);
  run_together(*backend, {&alone_in_slot_zero});
  Request other_alone(2, 0, kBlocksPerSequence, config.vocab_size, 12);
  run_together(*backend, {&other_alone});

  Request in_top_slot(1, lease.slot, 0, config.vocab_size, 11);
  Request other_in_slot_zero(2, 0, kBlocksPerSequence, config.vocab_size, 12);
  run_together(*backend, {&in_top_slot, &other_in_slot_zero});

  expect_bitwise_equal(in_top_slot.logits, alone_in_slot_zero.logits, "request in the top slot");
  expect_bitwise_equal(other_in_slot_zero.logits, other_alone.logits, "request in slot 0");
  pool.free(lease, 1);
}

}  // namespace
}  // namespace jambo::engine
