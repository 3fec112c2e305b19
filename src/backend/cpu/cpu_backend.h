// The CPU reference backend: the whole Jamba forward (spec §3) in fp32 with weights read in their
// stored dtype. Each row's logits are bitwise independent of the other rows in the step, of how
// its prompt was split into chunks and of the thread count (DESIGN.md laws 4 and 5).
#pragma once

#include "backend/backend.h"
#include "backend/communicator.h"

#include <memory>

namespace jambo::backend::cpu {

// Allocates the state slots and KV blocks of `cache`. The backend keeps its own copy of the model's
// views and a share of their storage. With a communicator the model is one rank's shard (model/tensor_parallel.h),
// and the backend sums its row-parallel partial outputs over the ranks.
std::unique_ptr<Backend> make_cpu_backend(const model::Model& model, const CacheConfig& cache,
                                          std::unique_ptr<Communicator> communicator = nullptr);

// `size` ranks, each a CPU backend of its shard of the model with a communicator of an in-process group, behind one
// backend (backend/tensor_parallel_backend.h).
std::unique_ptr<Backend> make_tensor_parallel_cpu_backend(const model::Model& model, const CacheConfig& cache,
                                                          int64_t size);

}  // namespace jambo::backend::cpu
