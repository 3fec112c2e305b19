// The batched reference path: many sequences per step, each its own row from zero state, equal bitwise on
// the CPU backend to each sequence scored alone (SequenceRunner, one-shot prefill, slot 0), whatever the
// packing: one-token rows, sequences longer than a step's token budget, more sequences than slots.
#include "forensics/sequence_runner.h"
#include "forensics/reference_scorer.h"
#include "support/forensics_test_util.h"

#include <gtest/gtest.h>

namespace jambo::forensics {
namespace {

using Sequences = std::vector<std::vector<int32_t>>;

// Each sequence alone: its own fresh backend run, one-shot prefill in slot 0.
std::vector<std::vector<double>> score_alone(const model::Model& model, const Sequences& sequences) {
  std::vector<std::vector<double>> out;
  for (const std::vector<int32_t>& sequence : sequences) {
    const backend::CacheConfig cache = single_sequence_cache(int64_t(sequence.size()));
    const std::unique_ptr<backend::Backend> backend = backend::cpu::make_cpu_backend(model, cache);
    SequenceRunner runner(*backend, cache);
    const ScoredSequence scored = runner.score(sequence, /*num_top_logprobs=*/0, "the sequence");
    std::vector<double> logprobs;
    for (size_t t = 1; t < scored.logprobs.size(); ++t) logprobs.push_back(*scored.logprobs[t]);
    out.push_back(logprobs);
  }
  return out;
}

class ReferenceScorerTest : public ::testing::Test {
 protected:
  testing::OneThread one_thread_;
  model::Model model_ = testing::load_fixture_model();  // MoE top-2, attention with GQA: every op kind a row crosses
  Sequences sequences_ = testing::mixed_reference_sequences(model_.config.vocab_size);
};

TEST_F(ReferenceScorerTest, PackedStepsEqualEachSequenceAloneBitwise) {
  const std::vector<std::vector<double>> alone = score_alone(model_, sequences_);
  ReferenceOptions packed;  // 20 sequences over slots for 3 rows: slots reused from step to step
  packed.max_step_tokens = 48;
  packed.max_step_rows = 3;
  ReferenceOptions one_step;  // the defaults: every row in one step
  for (const ReferenceOptions& options : {packed, one_step}) {
    int64_t last_done = 0;
    const std::vector<std::vector<double>> batched =
        score_sequences(model_, sequences_, options, [&](int64_t done, int64_t total) {
          EXPECT_GT(done, last_done);
          EXPECT_EQ(total, int64_t(sequences_.size()));
          last_done = done;
        });
    EXPECT_EQ(last_done, int64_t(sequences_.size()));
    ASSERT_EQ(batched.size(), sequences_.size());
    for (size_t i = 0; i < sequences_.size(); ++i) {
      ASSERT_EQ(batched[i].size(), sequences_[i].empty() ? 0 : sequences_[i].size() - 1) << "sequence " << i;
      for (size_t t = 0; t < batched[i].size(); ++t)
        ASSERT_EQ(batched[i][t], alone[i][t])
            << "sequence " << i << " position " << t + 1 << ", step rows " << options.max_step_rows;
    }
  }
}

TEST_F(ReferenceScorerTest, StepsKeepInputOrderUnderBothLimitsAndALongSequenceRunsAlone) {
  // Steps close at the third row (0..3, 5..8, 14..16) or before a row that would pass 48 tokens; sequences
  // over the budget run alone (4, 13, 17), one that fills it exactly too (10); rowless ones (2, 6) ride along.
  const std::vector<ReferenceStep> steps =
      plan_reference_steps(sequences_, /*max_step_tokens=*/48, /*max_step_rows=*/3);
  const std::vector<std::pair<size_t, size_t>> expected = {{0, 4},  {4, 1},  {5, 4},  {9, 1},  {10, 1},
                                                           {11, 2}, {13, 1}, {14, 3}, {17, 1}, {18, 2}};
  ASSERT_EQ(steps.size(), expected.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    EXPECT_EQ(steps[s].first, expected[s].first) << "step " << s;
    EXPECT_EQ(steps[s].count, expected[s].second) << "step " << s;
  }
  EXPECT_THROW(plan_reference_steps(sequences_, 0, 3), Error);
  EXPECT_THROW(plan_reference_steps(sequences_, 48, 0), Error);
}

TEST_F(ReferenceScorerTest, NothingToScoreNeedsNoBackend) {
  const Sequences nothing = {{}, {7}};
  // The CPU backend refuses a model whose weights are not on the host: it must never be created.
  const model::Model described = describe_random_model(model_.config, DType::BF16, 1);
  const std::vector<std::vector<double>> scored = score_sequences(described, nothing, ReferenceOptions{});
  ASSERT_EQ(scored.size(), 2u);
  EXPECT_TRUE(scored[0].empty());
  EXPECT_TRUE(scored[1].empty());
}

}  // namespace
}  // namespace jambo::forensics
