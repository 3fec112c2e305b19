// The CUDA backend's recurrent-state checkpoints (BatchRow::checkpoints, for prefix caching): inside a row the conv
// and the prefill scan write the state as they pass it (DeviceRows), after a row's last token the slot is copied once
// the step is done. With the invariant GEMMs, in the f32 and bf16 weight modes and with f32 and bf16 state, bitwise:
// - saving checkpoints changes no logit of the rows that save them;
// - a sequence resumed from a checkpoint (its copy in a slot of its own, the KV blocks before it copied too)
//   continues exactly as a sequence whose step ended there.
// The checkpoints fall inside a stage of the scan, on a stage's boundary, past the first chunk of 64 tokens and at a
// row's end, in a step of rows of one and of several tokens.
#include "support/test_models.h"
#include "cuda_test_util.h"

#include <numeric>

namespace jambo::testing {
namespace {

constexpr int64_t kBlocks = 48;    // per sequence, of kBlockSize tokens
constexpr int64_t kContinue = 6;   // tokens a resumed sequence runs
constexpr int64_t kNumSlots = 4;   // the step's three rows, and the resumed sequence

struct SavedRow {
  std::vector<int32_t> tokens;            // the row's step, then kContinue tokens more
  int64_t num_tokens = 0;                 // of the step
  std::vector<int64_t> checkpoint_after;  // tokens of the step before each checkpoint
};

// A row of 150 tokens saving at 5 (inside the scan's first stage), 32 (a stage's end), 64 (a chunk's end), 100 and
// 150 (its end), one of 40 saving at 17 and 40, and one of a single token saving after it.
std::vector<SavedRow> saved_rows(int64_t vocab_size) {
  std::vector<SavedRow> rows = {{{}, 150, {5, 32, 64, 100, 150}}, {{}, 40, {17, 40}}, {{}, 1, {1}}};
  for (size_t r = 0; r < rows.size(); ++r)
    rows[r].tokens = random_tokens(rows[r].num_tokens + kContinue, vocab_size, 40 + r);
  return rows;
}

int64_t count_checkpoints(const std::vector<SavedRow>& rows) {
  int64_t count = 0;
  for (const SavedRow& row : rows) count += int64_t(row.checkpoint_after.size());
  return count;
}

std::vector<int32_t> table_of(int64_t slot) {
  std::vector<int32_t> table(kBlocks);
  std::iota(table.begin(), table.end(), int32_t(slot * kBlocks));
  return table;
}

class CudaCheckpointTest : public GpuTest {
 protected:
  std::unique_ptr<backend::Backend> make(const model::Model& model, const std::string& weights, DType state_dtype,
                                         int64_t num_checkpoints) {
    backend::CacheConfig cache{kNumSlots, kNumSlots * kBlocks, kBlockSize};
    cache.state_dtype = state_dtype;
    cache.num_checkpoints = num_checkpoints;
    return backend::cuda::make_cuda_backend(model, cache, weights, /*decode_graphs=*/true, /*invariant_gemm=*/true);
  }

  // One step of the rows (row r in slot r), saving their checkpoints where `save`, in slots kNumSlots, ...:
  // every logits vector of every row.
  Logits run_step(backend::Backend& backend, const std::vector<SavedRow>& rows, bool save) {
    std::vector<std::vector<int32_t>> tables;
    std::vector<std::vector<backend::StateCheckpoint>> checkpoints(rows.size());
    std::vector<backend::BatchRow> batch;
    int64_t next_checkpoint = kNumSlots;
    for (size_t r = 0; r < rows.size(); ++r) tables.push_back(table_of(int64_t(r)));
    for (size_t r = 0; r < rows.size(); ++r) {
      backend::BatchRow row =
          backend::sequence_row(int64_t(r), rows[r].tokens, 0, rows[r].num_tokens, int64_t(r), tables[r], kBlockSize);
      for (int64_t after : rows[r].checkpoint_after) checkpoints[r].push_back({after, next_checkpoint++});
      if (save) row.checkpoints = checkpoints[r];
      row.copy_logits = backend::LogitsCopy::All;
      batch.push_back(row);
    }
    return forward(backend, batch);
  }

  static Logits forward(backend::Backend& backend, std::span<const backend::BatchRow> rows) {
    backend::StepOutput output;
    backend.forward(rows, output);
    Logits logits;
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t t = 0; rows[r].copy_logits == backend::LogitsCopy::All && t < int64_t(rows[r].tokens.size()); ++t) {
        const std::span<const float> vector = output.logits(int64_t(r), t);
        logits.emplace_back(vector.begin(), vector.end());
      }
    return logits;
  }

  // The kContinue tokens after `after` of a sequence in the last slot whose state and KV blocks are copied from
  // slot `from` and the blocks of slot `blocks_of` (the resumed), or computed in one step of `after` tokens (neither
  // given).
  static Logits continue_after(backend::Backend& backend, const SavedRow& row, int64_t after,
                               std::optional<std::pair<int64_t, int64_t>> copied_from) {
    const int64_t slot = kNumSlots - 1;
    const std::vector<int32_t> table = table_of(slot);
    if (copied_from) {
      backend.copy_state(copied_from->first, slot);
      const std::vector<int32_t> source = table_of(copied_from->second);
      for (int64_t b = 0; b < backend::kv_blocks_for(after, kBlockSize); ++b)
        backend.copy_kv_block(source[size_t(b)], table[size_t(b)]);
    } else {
      const backend::BatchRow prefix = backend::sequence_row(slot, row.tokens, 0, after, slot, table, kBlockSize);
      forward(backend, {&prefix, 1});
    }
    backend::BatchRow next = backend::sequence_row(slot, row.tokens, after, kContinue, slot, table, kBlockSize);
    next.copy_logits = backend::LogitsCopy::All;
    return forward(backend, {&next, 1});
  }
};

TEST_F(CudaCheckpointTest, SavingChangesNoLogitAndAResumedSequenceContinuesAsOneThatStoppedThere) {
  for (const TestModelSpec& spec : test_model_specs())
    for (const std::string weights : {"f32", "bf16"})
      for (const DType state_dtype : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(spec.name + ", " + weights + " weights, " + std::string(dtype_name(state_dtype)) + " state");
        const model::Model model = make_random_model(spec.config, spec.dtype, 3);
        const std::vector<SavedRow> rows = saved_rows(model.config.vocab_size);
        const int64_t num_checkpoints = count_checkpoints(rows);
        auto saving = make(model, weights, state_dtype, num_checkpoints);
        auto plain = make(model, weights, state_dtype, num_checkpoints);
        ASSERT_EQ(run_step(*saving, rows, true), run_step(*plain, rows, false));
        int64_t checkpoint_slot = kNumSlots;
        for (size_t r = 0; r < rows.size(); ++r)
          for (int64_t after : rows[r].checkpoint_after) {
            SCOPED_TRACE("row " + std::to_string(r) + ", checkpoint after " + std::to_string(after) + " tokens");
            const Logits resumed = continue_after(*saving, rows[r], after, std::pair(checkpoint_slot++, int64_t(r)));
            ASSERT_EQ(resumed, continue_after(*plain, rows[r], after, std::nullopt));
          }
      }
}

}  // namespace
}  // namespace jambo::testing
