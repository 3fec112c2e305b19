// The CPU backend split over ranks (make_tensor_parallel_cpu_backend, model/tensor_parallel.h): on the demo model and
// every fixture model, over every rank count each can be split over, each position's logprobs are close to the
// unsharded backend's, through chunked prefills, decode steps of several sequences and a state copied to a fork; and
// the ranks' sums in a fixed order keep a row's logits the same bits alone as beside other rows.
#include "backend/cpu/cpu_backend.h"
#include "backend/tensor_parallel_backend.h"
#include "model/tensor_parallel.h"
#include "support/tensor_parallel_scenario.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace jambo::backend::cpu {
namespace {

using testing::Logits;
using testing::Sequence;

model::Model fixture(const std::string& name) {
  return model::load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/" + name);
}

// Logprobs within `tolerance` of the unsharded backend's, at every position, over every rank count the model can be
// split over; returns how many rank counts were compared.
int64_t expect_close_to_unsharded(const model::Model& model, const std::function<double(const Logits&)>& tolerance) {
  const std::vector<Logits> whole =
      testing::run_split_scenario(*make_cpu_backend(model, testing::test_cache(3)), model.config.vocab_size);
  int64_t num_compared = 0;
  for (const int64_t size : {2, 3, 4}) {
    if (!model::tensor_parallel_obstacle(model.config, size).empty()) continue;
    SCOPED_TRACE(std::to_string(size) + " ranks");
    const std::vector<Logits> split =
        testing::run_split_scenario(*make_tensor_parallel_cpu_backend(model, testing::test_cache(3), size),
                                    model.config.vocab_size);
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

// The demo model (trained): within 1e-5. The fixtures (random weights at initialization scale, whose fp32 logprobs
// already lie up to 1.3e-4 from fp64's, reference.json: hf_fp32_vs_fp64_max_abs): the sums in another order move a
// logit by about 1e-6 of the largest, so within 1e-5 of the largest |logit|, the bound the fixtures hold the CPU
// backend to against transformers (forward_test.cpp).
TEST(TensorParallelCpuBackend, LogprobsAreCloseToTheUnshardedBackendOnTheDemoAndEveryFixture) {
  const model::Model demo = model::load_model(std::string(JAMBO_SOURCE_DIR) + "/models/jambo-demo");
  EXPECT_EQ(expect_close_to_unsharded(demo, [](const Logits&) { return 1e-5; }), 2);  // over 2 and 4 ranks
  int64_t num_compared = 0;
  for (const std::string& name : testing::kSplitFixtures) {
    SCOPED_TRACE(name);
    num_compared += expect_close_to_unsharded(
        fixture(name), [](const Logits& logits) { return 1e-5 * testing::largest_magnitude(logits); });
  }
  EXPECT_GE(num_compared, 12);
}

// A row alone and beside two others gives the same bits: each rank's sums and the all-reduce's order are fixed by
// the model's shape.
TEST(TensorParallelCpuBackend, ARowsLogitsAreTheSameBitsAloneAsInABatch) {
  const model::Model model = fixture("moe-top2-gqa2-fp32");
  const int64_t vocab = model.config.vocab_size;
  const auto [by_itself, among_others] = testing::run_alone_and_batched(
      *make_tensor_parallel_cpu_backend(model, testing::test_cache(3), 2),
      *make_tensor_parallel_cpu_backend(model, testing::test_cache(3), 2), vocab);
  EXPECT_EQ(by_itself.size(), 15u);
  EXPECT_EQ(by_itself, among_others);
}

// A rank that fails in a step after the rows were checked aborts the group: the other rank's all-reduce ends with an
// error instead of waiting forever, the step throws the failing rank's own error, and the backend steps no more. Rank 1
// holds fewer state slots than the backend, so a row in the last slot passes the backend's check and fails rank 1's.
TEST(TensorParallelCpuBackend, ARankThatFailsMidStepEndsTheStepOnEveryRank) {
  const model::Model model = fixture("moe-top2-gqa2-fp32");
  const int64_t vocab = model.config.vocab_size;
  std::vector<std::unique_ptr<Communicator>> group = make_in_process_group(2);
  Communicator* any_rank = group.front().get();
  const auto make_rank = [&](int64_t rank, const model::Model& shard) {
    return make_cpu_backend(shard, testing::test_cache(rank == 1 ? 2 : 3), std::move(group[size_t(rank)]));
  };
  auto backend = make_tensor_parallel_backend(model, testing::test_cache(3), 2, make_rank, [any_rank] {
    any_rank->abort();
  });
  Sequence in_last_slot(2, testing::random_tokens(6, vocab, 4)), in_first_slot(0, testing::random_tokens(6, vocab, 5));
  try {
    testing::step(*backend, {&in_last_slot}, {6});
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).find("aborted"), std::string::npos) << error.what();  // rank 1's own
  }
  try {
    testing::step(*backend, {&in_first_slot}, {6});
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("failed in an earlier step"), std::string::npos) << error.what();
  }
}

// A rank's backend that counts its sleeps and wakes, and can fail to sleep (as a CUDA rank whose host memory for the
// weights' copy runs out).
class SleepCountingRank : public Backend {
 public:
  SleepCountingRank(std::unique_ptr<Backend> rank, bool fails_to_sleep)
      : rank_(std::move(rank)), fails_to_sleep_(fails_to_sleep) {}
  const model::JambaConfig& config() const override { return rank_->config(); }
  void forward(std::span<const BatchRow> rows, StepOutput& output) override { rank_->forward(rows, output); }
  void copy_state(int64_t from_slot, int64_t to_slot) override { rank_->copy_state(from_slot, to_slot); }
  void copy_kv_block(int64_t from_block, int64_t to_block) override { rank_->copy_kv_block(from_block, to_block); }
  void poison_state(int64_t slot) override { rank_->poison_state(slot); }
  int64_t state_elements_per_slot() const override { return rank_->state_elements_per_slot(); }
  void inject_faults(const FaultInjection& faults) override { rank_->inject_faults(faults); }
  void update_weights(const model::WeightUpdate& update) override { rank_->update_weights(update); }
  model::Checkpoint open_ipc_tensors(std::span<const IpcTensor> tensors) override {
    return rank_->open_ipc_tensors(tensors);
  }
  void sleep(SleepLevel level) override {
    if (fails_to_sleep_) fail("no host memory for the weights' copy");
    rank_->sleep(level);
    ++num_sleeps;
  }
  void wake_up(const WakeTags& tags) override {
    rank_->wake_up(tags);
    ++num_wakes;
  }
  int64_t num_sleeps = 0, num_wakes = 0;

 private:
  std::unique_ptr<Backend> rank_;
  bool fails_to_sleep_;
};

// The ranks sleep all or none: where rank 1 cannot, rank 0, already asleep, wakes again, the error is rank 1's, and
// the backend steps on as before.
TEST(TensorParallelCpuBackend, ARankThatCannotSleepWakesTheOthers) {
  const model::Model model = fixture("moe-top2-gqa2-fp32");
  const int64_t vocab = model.config.vocab_size;
  std::vector<std::unique_ptr<Communicator>> group = make_in_process_group(2);
  std::vector<SleepCountingRank*> ranks;
  const auto make_rank = [&](int64_t rank, const model::Model& shard) {
    auto counting = std::make_unique<SleepCountingRank>(
        make_cpu_backend(shard, testing::test_cache(3), std::move(group[size_t(rank)])), rank == 1);
    ranks.push_back(counting.get());
    return counting;
  };
  auto backend = make_tensor_parallel_backend(model, testing::test_cache(3), 2, make_rank, [] {});
  ASSERT_EQ(ranks.size(), 2u);
  try {
    backend->sleep(SleepLevel::KeepWeights);
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("no host memory"), std::string::npos) << error.what();
  }
  EXPECT_EQ(ranks[0]->num_sleeps, 1);
  EXPECT_EQ(ranks[0]->num_wakes, 1);
  EXPECT_EQ(ranks[1]->num_sleeps, 0);
  EXPECT_EQ(testing::run_split_scenario(*backend, vocab),
            testing::run_split_scenario(*make_tensor_parallel_cpu_backend(model, testing::test_cache(3), 2), vocab));
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
