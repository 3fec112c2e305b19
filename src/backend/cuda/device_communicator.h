// Collectives among the GPUs of a tensor-parallel CUDA backend, one communicator per rank: the twin of
// backend/communicator.h. A sum is taken in rank order, (((rank 0 + rank 1) + rank 2) + ...), on every rank and for
// every message size, so that a token's sums do not depend on its batch. NCCL's own all-reduce cannot promise that:
// it picks its algorithm and cuts its chunks by the message's size, so an element's order of addition would move
// with the step's token count. Here NCCL only moves data (sends and receives); our kernel adds.
#pragma once

#include "backend/cuda/device_memory.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace jambo::backend::cuda {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  virtual int device() const = 0;  // the GPU that holds the rank's buffers
  // Every rank passes `count` values on its GPU, ready in `stream`'s order; once the work enqueued on `stream` has run,
  // each entry holds the sum over the ranks in rank order, the same bits on every rank.
  virtual void all_reduce_sum(float* values, int64_t count, cudaStream_t stream) = 0;
  // Whether all_reduce_sum's work can be recorded into a CUDA graph (step_graphs.h).
  virtual bool capturable() const = 0;
  // Lets go of the scratch memory the collectives grew (a sleeping backend's).
  virtual void release_scratch() = 0;
  // Ends the group: every rank's collective in progress or to come fails, so that the others do not wait forever for
  // a rank that failed mid-step (backend/communicator.h). Any rank may call it, from any thread.
  virtual void abort() = 0;
};

constexpr int64_t kMaxRanks = 16;

// The ranks' contributions to one sum, device pointers each of `count` values, in rank order.
struct RankParts {
  const float* parts[kMaxRanks] = {};
  int64_t num_parts = 0;
};

// sum[i] = ((parts[0][i] + parts[1][i]) + ...) for i < count. `sum` may be one of the parts.
void sum_in_rank_order(const RankParts& parts, float* sum, int64_t count, cudaStream_t stream);

// The communicators of ranks 0..size-1 on GPUs 0..size-1 of this process, over NCCL (ncclCommInitAll), with NVLink
// multicast (NVLS) off. Throws jambo::Error when fewer GPUs are visible or the build has no NCCL.
std::vector<std::unique_ptr<DeviceCommunicator>> make_nccl_group(int64_t size);

// Whether this build has NCCL (tensor parallelism on the CUDA backend).
bool nccl_available();

}  // namespace jambo::backend::cuda
