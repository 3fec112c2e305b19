// Tensor parallelism behind one Backend (model/tensor_parallel.h says how the model is split). One process drives
// every rank, each on a thread of its own: the engine, scheduler and sampler stay single and unchanged, no request
// crosses a process boundary, and the ranks' communicators come from one call (NCCL's ncclCommInitAll on the GPUs).
#pragma once

#include "backend/backend.h"

#include <functional>
#include <memory>
#include <vector>

namespace jambo::backend {

// Runs on a rank's thread before its share of a step (the CPU ranks' share of the OpenMP threads), or nothing.
using RankThreadSetup = std::function<void(int64_t rank)>;

// `ranks[r]` is a backend of shard r of `model` (model::shard_model(model, r, ranks.size())) holding communicator r of
// one group. Every rank runs every step; rank 0's logits are the step's, and every rank holds the same bits of them.
// A weight update gives each rank its shard of the new values. The state of a slot and a KV block are each rank's
// share of them.
std::unique_ptr<Backend> make_tensor_parallel_backend(const model::Model& model, const CacheConfig& cache,
                                                      std::vector<std::unique_ptr<Backend>> ranks,
                                                      RankThreadSetup setup_thread = {});

}  // namespace jambo::backend
