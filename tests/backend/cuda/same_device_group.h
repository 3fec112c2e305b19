// The ranks of one tensor-parallel group on one GPU, so that the sharded CUDA forward runs without several GPUs. Each
// rank's all-reduce synchronizes its stream, waits for every rank, sums every rank's values in rank order into a
// scratch of its own (sum_in_rank_order, the NCCL ranks' kernel), waits again and copies the sum back. It makes the
// host wait inside a step, so its backends run no graphs.
#pragma once

#include "backend/communicator.h"
#include "backend/cuda/device_communicator.h"

#include <memory>
#include <vector>

namespace jambo::testing {

class SameDeviceCommunicator final : public backend::cuda::DeviceCommunicator {
 public:
  struct Shared {
    explicit Shared(int64_t size) : values(size_t(size)), barrier(size) {}
    std::vector<const float*> values;  // [size] each rank's values of the all-reduce in progress
    backend::GroupBarrier barrier;
  };

  SameDeviceCommunicator(int64_t rank, std::shared_ptr<Shared> shared) : rank_(rank), shared_(std::move(shared)) {}

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return int64_t(shared_->values.size()); }
  int device() const override { return 0; }
  bool capturable() const override { return false; }
  void release_scratch() override { sum_ = {}; }
  void abort() override { shared_->barrier.abort(); }

  void all_reduce_sum(float* values, int64_t count, cudaStream_t stream) override {
    JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
    shared_->values[size_t(rank_)] = values;
    shared_->barrier.arrive_and_wait();
    backend::cuda::RankParts parts;
    parts.num_parts = size();
    for (int64_t r = 0; r < size(); ++r) parts.parts[r] = shared_->values[size_t(r)];
    float* sum = sum_.reserve(count);
    backend::cuda::sum_in_rank_order(parts, sum, count, stream);
    JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
    shared_->barrier.arrive_and_wait();
    JAMBO_CUDA_CHECK(cudaMemcpyAsync(values, sum, size_t(count) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }

 private:
  int64_t rank_;
  std::shared_ptr<Shared> shared_;
  backend::cuda::DeviceBuffer<float> sum_;
};

inline std::vector<std::unique_ptr<backend::cuda::DeviceCommunicator>> make_same_device_group(int64_t size) {
  auto shared = std::make_shared<SameDeviceCommunicator::Shared>(size);
  std::vector<std::unique_ptr<backend::cuda::DeviceCommunicator>> group;
  for (int64_t rank = 0; rank < size; ++rank) group.push_back(std::make_unique<SameDeviceCommunicator>(rank, shared));
  return group;
}

}  // namespace jambo::testing
