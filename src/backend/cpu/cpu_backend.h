// The CPU reference backend: the whole Jamba forward (spec §3) in fp32 with weights read in their
// stored dtype. Each row's logits are bitwise independent of the other rows in the step, of how
// its prompt was split into chunks and of the thread count (DESIGN.md laws 4 and 5).
#pragma once

#include "backend/backend.h"

#include <memory>

namespace jambo::backend::cpu {

// Allocates the state slots and KV blocks of `cache`. The backend keeps its own copy of the model's
// views and a share of their storage.
std::unique_ptr<Backend> make_cpu_backend(const model::Model& model, const CacheConfig& cache);

}  // namespace jambo::backend::cpu
