#include "backend/communicator.h"

#include "core/error.h"

namespace jambo::backend {

void GroupBarrier::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  const auto require_not_aborted = [&] {
    JAMBO_REQUIRE(!aborted_, "the tensor-parallel group was aborted: another rank failed in this step");
  };
  require_not_aborted();
  const int64_t generation = generation_;
  if (++num_arrived_ == size_) {
    num_arrived_ = 0;
    ++generation_;
    changed_.notify_all();
    return;
  }
  changed_.wait(lock, [&] { return aborted_ || generation_ != generation; });
  if (generation_ == generation) require_not_aborted();
}

void GroupBarrier::abort() {
  const std::lock_guard lock(mutex_);
  aborted_ = true;
  changed_.notify_all();
}

namespace {

// What the ranks of one group share: each rank's buffer of the collective in progress, and a barrier.
struct InProcessShared {
  explicit InProcessShared(int64_t size) : buffers(size_t(size)), barrier(size) {}
  std::vector<std::span<float>> buffers;  // [size]
  GroupBarrier barrier;
};

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(int64_t rank, std::shared_ptr<InProcessShared> shared)
      : rank_(rank), shared_(std::move(shared)) {}

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return int64_t(shared_->buffers.size()); }
  void abort() override { shared_->barrier.abort(); }

  // Every rank posts its buffer; once all have, each sums all of them in rank order into its own scratch, and once
  // all have read them, copies the sum back.
  void all_reduce_sum(std::span<float> values) override {
    std::vector<std::span<float>>& buffers = shared_->buffers;
    buffers[size_t(rank_)] = values;
    shared_->barrier.arrive_and_wait();
    for (const std::span<float> buffer : buffers)
      JAMBO_REQUIRE(buffer.size() == values.size(), "all_reduce_sum: rank {} passes {} values, another rank {}",
                    rank_, values.size(), buffer.size());
    sum_.assign(buffers[0].begin(), buffers[0].end());
    for (size_t r = 1; r < buffers.size(); ++r)
      for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += buffers[r][i];
    shared_->barrier.arrive_and_wait();
    std::copy(sum_.begin(), sum_.end(), values.begin());
  }

 private:
  int64_t rank_;
  std::shared_ptr<InProcessShared> shared_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int64_t size) {
  JAMBO_REQUIRE(size >= 1, "a communicator group needs at least one rank, got {}", size);
  auto shared = std::make_shared<InProcessShared>(size);
  std::vector<std::unique_ptr<Communicator>> group;
  for (int64_t rank = 0; rank < size; ++rank) group.push_back(std::make_unique<InProcessCommunicator>(rank, shared));
  return group;
}

}  // namespace jambo::backend
