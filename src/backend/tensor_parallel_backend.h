// Tensor parallelism behind one Backend (model/tensor_parallel.h says how the model is split). One process drives
// every rank, each on a thread of its own: the engine, scheduler and sampler stay single and unchanged, no request
// crosses a process boundary, and the ranks' communicators come from one call (NCCL's ncclCommInitAll on the GPUs).
#pragma once

#include "backend/backend.h"

#include <functional>
#include <memory>
#include <vector>

namespace jambo::backend {

// Makes rank r's backend of its shard of the model (model::shard_model), holding communicator r of one group.
using MakeRank = std::function<std::unique_ptr<Backend>(int64_t rank, const model::Model& shard)>;
// Ends the ranks' communicator group (Communicator::abort, DeviceCommunicator::abort).
using AbortGroup = std::function<void()>;
// Runs on a rank's thread before its share of a step (the CPU ranks' share of the OpenMP threads), or nothing.
using RankThreadSetup = std::function<void(int64_t rank)>;

// `size` ranks, each made by make_rank from its shard (kept for weight updates). Every rank runs every step; rank 0's
// logits are the step's, and every rank holds the same bits of them. A rank that fails in a step calls abort_group,
// the step throws its error and the backend steps no more. A weight update from a folder gives each rank its shard of
// the new values; one from GPU memory is refused. The state of a slot and a KV block are each rank's share of them.
std::unique_ptr<Backend> make_tensor_parallel_backend(const model::Model& model, const CacheConfig& cache,
                                                      int64_t size, const MakeRank& make_rank, AbortGroup abort_group,
                                                      RankThreadSetup setup_thread = {});

}  // namespace jambo::backend
