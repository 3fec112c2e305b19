// Picks a backend by name ("cpu", or "cuda" when this build has CUDA), so that every command and the
// server can run on either with one flag.
#pragma once

#include "backend/backend.h"

#include <memory>
#include <string>
#include <vector>

namespace jambo {

// The backends this build has, "cpu" first.
std::vector<std::string> available_backends();

// Throws jambo::Error naming the backend when it is unknown or not in this build. cuda_weights is the CUDA
// backend's weight mode ("f32", "bf16" or "f16"); the CPU backend ignores it.
std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model, const CacheConfig& cache,
                                      const std::string& cuda_weights = "f32");

// The bytes of weights that backend holds for the model (what a memory plan takes before the caches): the
// checkpoint's bytes on the CPU, which reads the mmap; on the GPU what the weight mode uploads.
int64_t backend_weight_bytes(const std::string& name, const Model& model, const std::string& cuda_weights = "f32");

// The recurrent state's storage type by its flag name: "f32" or "bf16". Throws jambo::Error naming the value.
DType state_dtype_named(const std::string& name);

// The memory a backend's caches can take now, for budgets given as a fraction: MemAvailable of
// /proc/meminfo for "cpu", the GPU's free memory for "cuda". Throws jambo::Error like make_backend.
int64_t available_memory_bytes(const std::string& backend_name);

}  // namespace jambo
