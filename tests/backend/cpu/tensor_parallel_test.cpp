// The CPU backend split over ranks (make_tensor_parallel_cpu_backend, model/tensor_parallel.h): on the demo model and
// every fixture model, over every rank count each can be split over, each position's logprobs are close to the
// unsharded backend's, through chunked prefills, decode steps of several sequences and a state copied to a fork; and
// the ranks' sums in a fixed order keep a row's logits the same bits alone as beside other rows.
#include "backend/cpu/cpu_backend.h"
#include "model/tensor_parallel.h"
#include "support/sequences.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace jambo::backend::cpu {
namespace {

using testing::Logits;
using testing::Sequence;

const std::vector<std::string> kFixtures = {"attn-heavy-tied-bf16",   "dense-gqa1-projbias-fp32", "fused-experts-fp32",
                                            "moe-top1-mqa-tied-bf16", "moe-top2-gqa2-fp32",       "mqa-top2-tied-fp32",
                                            "sharded-gqa4-bf16"};

model::Model fixture(const std::string& name) {
  return model::load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/" + name);
}

// Two sequences: the first prefilled in chunks of 5 and 9 tokens beside the second's 7 and 2, then both decoded
// together; the first's state and KV blocks copied to a third sequence, which decodes beside it. Every position's
// logits, sequence by sequence.
std::vector<Logits> run(Backend& backend, int64_t vocab_size) {
  const std::vector<int32_t> tokens = testing::random_tokens(20, vocab_size, 5);
  Sequence first(0, tokens), second(1, testing::random_tokens(14, vocab_size, 6)), fork(2, tokens);
  std::vector<Logits> logits(3);
  testing::step(backend, {&first, &second}, {5, 7}, {&logits[0], &logits[1]});
  testing::step(backend, {&first, &second}, {9, 2}, {&logits[0], &logits[1]});
  for (int i = 0; i < 3; ++i) testing::step(backend, {&first, &second}, {1, 1}, {&logits[0], &logits[1]});
  backend.copy_state(first.slot, fork.slot);
  for (int64_t b = 0; b < backend::kv_blocks_for(first.num_computed, testing::kBlockSize); ++b)
    backend.copy_kv_block(first.block_table[size_t(b)], fork.block_table[size_t(b)]);
  fork.num_computed = first.num_computed;
  for (int i = 0; i < 3; ++i) testing::step(backend, {&first, &fork}, {1, 1}, {&logits[0], &logits[2]});
  return logits;
}

// Logprobs within `tolerance` of the unsharded backend's, at every position, over every rank count the model can be
// split over; returns how many rank counts were compared.
int64_t expect_close_to_unsharded(const model::Model& model, const std::function<double(const Logits&)>& tolerance) {
  const std::vector<Logits> whole = run(*make_cpu_backend(model, testing::test_cache(3)), model.config.vocab_size);
  int64_t num_compared = 0;
  for (const int64_t size : {2, 3, 4}) {
    if (!model::tensor_parallel_obstacle(model.config, size).empty()) continue;
    SCOPED_TRACE(std::to_string(size) + " ranks");
    const std::vector<Logits> split =
        run(*make_tensor_parallel_cpu_backend(model, testing::test_cache(3), size), model.config.vocab_size);
    for (size_t s = 0; s < whole.size(); ++s) {
      EXPECT_EQ(split[s].size(), whole[s].size());
      const double bound = tolerance(whole[s]);
      for (size_t p = 0; p < whole[s].size(); ++p)
        EXPECT_LE(testing::max_logprob_difference(split[s][p], whole[s][p]), bound)
            << "sequence " << s << " position " << p;
    }
    ++num_compared;
  }
  return num_compared;
}

double largest_magnitude(const Logits& logits) {
  double largest = 0;
  for (const std::vector<float>& vector : logits)
    for (float value : vector) largest = std::max(largest, double(std::fabs(value)));
  return largest;
}

// The demo model (trained): within 1e-5. The fixtures (random weights at initialization scale, whose fp32 logprobs
// already lie up to 1.3e-4 from fp64's, reference.json: hf_fp32_vs_fp64_max_abs): the sums in another order move a
// logit by about 1e-6 of the largest, so within 1e-5 of the largest |logit|, the bound the fixtures hold the CPU
// backend to against transformers (forward_test.cpp).
TEST(TensorParallelCpuBackend, LogprobsAreCloseToTheUnshardedBackendOnTheDemoAndEveryFixture) {
  const model::Model demo = model::load_model(std::string(JAMBO_SOURCE_DIR) + "/models/jambo-demo");
  EXPECT_EQ(expect_close_to_unsharded(demo, [](const Logits&) { return 1e-5; }), 2);  // over 2 and 4 ranks
  int64_t num_compared = 0;
  for (const std::string& name : kFixtures) {
    SCOPED_TRACE(name);
    num_compared +=
        expect_close_to_unsharded(fixture(name), [](const Logits& logits) { return 1e-5 * largest_magnitude(logits); });
  }
  EXPECT_GE(num_compared, 12);
}

// A row alone and beside two others gives the same bits: each rank's sums and the all-reduce's order are fixed by
// the model's shape.
TEST(TensorParallelCpuBackend, ARowsLogitsAreTheSameBitsAloneAsInABatch) {
  const model::Model model = fixture("moe-top2-gqa2-fp32");
  const std::vector<int32_t> tokens = testing::random_tokens(12, model.config.vocab_size, 8);
  auto alone = make_tensor_parallel_cpu_backend(model, testing::test_cache(3), 2);
  auto batched = make_tensor_parallel_cpu_backend(model, testing::test_cache(3), 2);
  Sequence probe(0, tokens), probe_again(0, tokens), other(1, testing::random_tokens(9, model.config.vocab_size, 9)),
      third(2, testing::random_tokens(4, model.config.vocab_size, 10));
  Logits by_itself, among_others, unused;
  testing::step(*alone, {&probe}, {12}, {&by_itself});
  testing::step(*batched, {&other, &probe_again, &third}, {9, 12, 4}, {&unused, &among_others, &unused});
  EXPECT_EQ(by_itself, among_others);
}

TEST(TensorParallelCpuBackend, AModelThatCannotBeSplitIsRefusedNamingWhy) {
  const model::Model model = fixture("mqa-top2-tied-fp32");
  try {
    make_tensor_parallel_cpu_backend(model, testing::test_cache(1), 4);
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("4 ranks do not divide the 6 attention heads"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace jambo::backend::cpu
