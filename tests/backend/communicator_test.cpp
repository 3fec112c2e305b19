// The in-process communicator's all-reduce against a plain sum: every rank gets, bit for bit, the sum over the ranks
// taken in rank order, whatever the threads' timing, call after call; lengths that differ are refused on every rank.
#include "backend/communicator.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

namespace jambo::backend {
namespace {

// Runs body(rank) on one thread per rank; returns each rank's exception message ("" where none).
std::vector<std::string> on_every_rank(int64_t size, const std::function<void(Communicator&)>& body) {
  std::vector<std::unique_ptr<Communicator>> group = make_in_process_group(size);
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        body(*group[size_t(rank)]);
      } catch (const Error& error) {
        errors[size_t(rank)] = error.what();
      }
    });
  for (std::thread& thread : threads) thread.join();
  return errors;
}

// Values of very different magnitudes, so that the order of the sum shows in its bits.
std::vector<float> values_of(int64_t rank, int64_t call, int64_t count) {
  std::mt19937 random(uint32_t(1000 * call + rank));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = uniform(random) * float(1 << (random() % 24));
  return values;
}

TEST(InProcessCommunicator, AllReduceIsThePlainSumInRankOrderOnEveryRank) {
  constexpr int64_t kCount = 1000, kCalls = 20;
  for (const int64_t size : {1, 2, 3, 5, 8}) {
    std::vector<std::vector<std::vector<float>>> results(static_cast<size_t>(size));  // [rank][call]
    const std::vector<std::string> errors = on_every_rank(size, [&](Communicator& communicator) {
      EXPECT_EQ(communicator.size(), size);
      for (int64_t call = 0; call < kCalls; ++call) {
        std::vector<float> values = values_of(communicator.rank(), call, kCount);
        communicator.all_reduce_sum(values);
        results[size_t(communicator.rank())].push_back(std::move(values));
      }
    });
    for (const std::string& error : errors) EXPECT_EQ(error, "");
    for (int64_t call = 0; call < kCalls; ++call) {
      std::vector<float> expected = values_of(0, call, kCount);
      for (int64_t rank = 1; rank < size; ++rank) {
        const std::vector<float> values = values_of(rank, call, kCount);
        for (int64_t i = 0; i < kCount; ++i) expected[size_t(i)] += values[size_t(i)];
      }
      for (int64_t rank = 0; rank < size; ++rank)
        ASSERT_EQ(results[size_t(rank)][size_t(call)], expected)
            << size << " ranks, rank " << rank << ", call " << call;
    }
  }
}

TEST(InProcessCommunicator, LengthsThatDifferAreRefusedOnEveryRank) {
  const std::vector<std::string> errors = on_every_rank(3, [](Communicator& communicator) {
    std::vector<float> values(size_t(4 + (communicator.rank() == 2)));
    communicator.all_reduce_sum(values);
  });
  for (const std::string& error : errors) EXPECT_NE(error.find("all_reduce_sum: rank"), std::string::npos) << error;
  EXPECT_THROW(make_in_process_group(0), Error);
}

// A rank that aborts instead of joining the all-reduce ends it on the others, which would otherwise wait forever, and
// every collective after it fails too.
TEST(InProcessCommunicator, AnAbortEndsTheCollectivesOfEveryRank) {
  const std::vector<std::string> errors = on_every_rank(3, [](Communicator& communicator) {
    std::vector<float> values(4, 1.0f);
    if (communicator.rank() == 1) communicator.abort();
    communicator.all_reduce_sum(values);
  });
  for (const std::string& error : errors) EXPECT_NE(error.find("group was aborted"), std::string::npos) << error;
}

}  // namespace
}  // namespace jambo::backend
