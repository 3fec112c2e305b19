// The CUDA backend: the whole Jamba forward on one GPU, fp32 activations and state, weights upcast to fp32
// at load (f32 mode: within 1e-4 of the CPU backend on logprobs). Same rows, slots, KV blocks, checks and
// fault injection as the CPU backend, whose kernels are each one's test oracle.
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <memory>

namespace jambo {

// Uploads the model's weights and allocates the state slots and KV blocks of `cache` on GPU 0 (zeroed).
// Throws jambo::Error when no GPU can be used or memory runs out.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const CacheConfig& cache);

// Free memory on the current GPU (cudaMemGetInfo), for memory budgets given as a fraction.
int64_t cuda_available_memory_bytes();

// Whether a CUDA device can be used here (for tests that skip without one).
bool cuda_device_available();

}  // namespace jambo
