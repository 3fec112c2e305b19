// Laws 1, 4 and 5 on the CPU backend, bitwise: chunking, decoding, batch composition, thread count
// and a poisoned slot do not change a row's logits.
#include "backend/cpu/cpu_backend.h"
#include "support/random_tensors.h"
#include "support/sequences.h"
#include "support/test_models.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

namespace jambo::backend::cpu {
namespace {

using testing::Logits;
using testing::Sequence;

constexpr int64_t kSequenceLength = 19;

void expect_bitwise_equal(const Logits& actual, const Logits& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t t = 0; t < actual.size(); ++t) {
    ASSERT_EQ(actual[t].size(), expected[t].size()) << what;
    EXPECT_TRUE(testing::bitwise_equal(actual[t].data(), expected[t].data(), int64_t(actual[t].size())))
        << what << ": logits of position " << t << " differ";
  }
}

class InvarianceTest : public ::testing::TestWithParam<testing::TestModelSpec> {
 protected:
  void SetUp() override {
    model_ = make_random_model(GetParam().config, GetParam().dtype, 7);
    tokens_ = testing::random_tokens(kSequenceLength, model_.config.vocab_size, 3);
  }
  Logits one_shot() {
    auto backend = make_cpu_backend(model_, testing::test_cache(1));
    return testing::run_in_chunks(*backend, Sequence(0, tokens_), {kSequenceLength});
  }

  model::Model model_;
  std::vector<int32_t> tokens_;
};

TEST_P(InvarianceTest, ChunkedPrefillIsBitwiseOneShot) {
  const Logits expected = one_shot();
  std::vector<std::vector<int64_t>> chunkings = {std::vector<int64_t>(kSequenceLength, 1), {1, 18}, {18, 1}};
  for (uint64_t seed = 0; seed < 4; ++seed) chunkings.push_back(testing::random_chunking(kSequenceLength, 6, seed));
  for (const auto& chunk_sizes : chunkings) {
    auto backend = make_cpu_backend(model_, testing::test_cache(1));
    std::string what = "chunks";
    for (int64_t size : chunk_sizes) what.append(" ").append(std::to_string(size));
    expect_bitwise_equal(testing::run_in_chunks(*backend, Sequence(0, tokens_), chunk_sizes), expected, what);
  }
}

// Prefill asking only for the last logits, then decode token by token: each step's single vector
// equals the one-shot prefill's vector of that position.
TEST_P(InvarianceTest, DecodeAfterPrefillIsBitwisePrefill) {
  const Logits expected = one_shot();
  auto backend = make_cpu_backend(model_, testing::test_cache(1));
  Sequence sequence(0, tokens_);
  const int64_t prompt_length = 7;
  for (int64_t num_tokens = prompt_length; sequence.num_computed < kSequenceLength; num_tokens = 1) {
    const std::vector<BatchRow> rows = {sequence.row(num_tokens, LogitsCopy::Last)};
    StepOutput logits;
    backend->forward(rows, logits);
    sequence.num_computed += num_tokens;
    const std::span<const float> last = logits.logits(0);
    ASSERT_EQ(logits.values.size(), size_t(model_.config.vocab_size));
    EXPECT_TRUE(testing::bitwise_equal(last.data(), expected[sequence.num_computed - 1].data(),
                                       model_.config.vocab_size))
        << "position " << sequence.num_computed - 1;
  }
}

// The same row alone and with 1..5 other rows of different lengths and phases: fresh prompts,
// continuing prompts and decodes, placed before and after it in the step.
TEST_P(InvarianceTest, RowIsBitwiseIndependentOfItsBatch) {
  const std::vector<int64_t> chunk_sizes = {5, 1, 3, 1, 9};
  Logits alone;
  {
    auto backend = make_cpu_backend(model_, testing::test_cache(1));
    alone = testing::run_in_chunks(*backend, Sequence(0, tokens_), chunk_sizes);
  }
  for (int64_t num_others = 1; num_others <= 5; ++num_others) {
    auto backend = make_cpu_backend(model_, testing::test_cache(1 + num_others));
    Sequence target(0, tokens_);
    std::vector<Sequence> others;
    for (int64_t i = 1; i <= num_others; ++i) {
      others.emplace_back(i, testing::random_tokens(40, model_.config.vocab_size, uint64_t(100 * num_others + i)));
      if (i % 2 == 0) testing::step(*backend, {&others.back()}, {3 * i});  // already in progress
    }
    Logits together;
    for (size_t chunk = 0; chunk < chunk_sizes.size(); ++chunk) {
      std::vector<Sequence*> batch;
      std::vector<int64_t> sizes;
      for (size_t i = 0; i < others.size(); ++i) {
        batch.push_back(&others[i]);
        sizes.push_back(int64_t(1 + (i + chunk) % 4));
      }
      const size_t target_place = (chunk + size_t(num_others)) % (batch.size() + 1);
      batch.insert(batch.begin() + long(target_place), &target);
      sizes.insert(sizes.begin() + long(target_place), chunk_sizes[chunk]);
      std::vector<Logits> outputs(batch.size());
      std::vector<Logits*> output_pointers;
      for (Logits& output : outputs) output_pointers.push_back(&output);
      testing::step(*backend, batch, sizes, output_pointers);
      for (auto& vector : outputs[target_place]) together.push_back(vector);
    }
    expect_bitwise_equal(together, alone, "with " + std::to_string(num_others) + " other rows");
  }
}

TEST_P(InvarianceTest, ThreadCountDoesNotChangeBits) {
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Logits one_thread = one_shot();
  omp_set_num_threads(2);
  const Logits two_threads = one_shot();
  omp_set_num_threads(saved_threads);
  expect_bitwise_equal(two_threads, one_thread, "2 threads vs 1");
}

// Law 1: a row without initial state never reads its slot, so a NaN-poisoned slot is harmless.
TEST_P(InvarianceTest, FreshRowNeverReadsItsPoisonedSlot) {
  const Logits clean = one_shot();
  auto backend = make_cpu_backend(model_, testing::test_cache(1));
  backend->poison_state(0);
  const Logits after_poison = testing::run_in_chunks(*backend, Sequence(0, tokens_), {1, 4, kSequenceLength - 5});
  for (const auto& vector : after_poison)
    for (float value : vector) ASSERT_TRUE(std::isfinite(value));
  expect_bitwise_equal(after_poison, clean, "after poison_state");
}

INSTANTIATE_TEST_SUITE_P(TestModels, InvarianceTest, ::testing::ValuesIn(testing::test_model_specs()),
                         testing::spec_name);

}  // namespace
}  // namespace jambo::backend::cpu
