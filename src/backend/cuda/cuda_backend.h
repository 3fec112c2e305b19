// The CUDA backend: the whole Jamba forward on one GPU, fp32 activations and state. Weights: "f32" (upcast to
// fp32 at load, fp32 GEMMs: within 1e-4 of the CPU backend on logprobs), "bf16" (GEMM weights as stored, GEMM
// inputs rounded to the weights' 16-bit type, fp32 accumulation: tests/backend/cuda/forward_test.cpp states its
// tolerance) or "f16" (GEMM weights converted to IEEE half at load, then as bf16). Decode steps run as CUDA
// graphs (step_graphs.h). Same rows, slots, KV blocks, checks and fault injection as the CPU backend, whose
// kernels are each one's test oracle.
#pragma once

#include "backend/backend.h"
#include "backend/cuda/device_communicator.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace jambo::backend::cuda {

// Uploads the model's weights and allocates the state slots and KV blocks of `cache` on GPU 0 (zeroed).
// Throws jambo::Error when no GPU can be used or memory runs out.
// weights: "f32", "bf16" or "f16" (jambo::Error otherwise). decode_graphs: decode steps run as CUDA graphs
// (step_graphs.h); off, every step runs launch by launch (the graphs' test oracle). invariant_gemm: every GEMM in one
// summation order for every row count (gemm.h). With a communicator the model is one rank's shard
// (model/tensor_parallel.h), on the communicator's GPU, and the backend sums its row-parallel partial outputs over
// the ranks (graphs only where the communicator's work can be recorded).
std::unique_ptr<Backend> make_cuda_backend(const model::Model& model, const CacheConfig& cache,
                                           const std::string& weights = "f32", bool decode_graphs = true,
                                           bool invariant_gemm = false,
                                           std::unique_ptr<DeviceCommunicator> communicator = nullptr);

// One rank per communicator of `group` (make_nccl_group: one GPU each), each a CUDA backend of its shard of the model,
// behind one backend (backend/tensor_parallel_backend.h). Over several ranks every step runs launch by launch.
std::unique_ptr<Backend> make_tensor_parallel_cuda_backend(const model::Model& model, const CacheConfig& cache,
                                                           std::vector<std::unique_ptr<DeviceCommunicator>> group,
                                                           const std::string& weights, bool decode_graphs,
                                                           bool invariant_gemm);

// How many steps of a CUDA backend ran as a CUDA graph's launch (0 for any other backend): for tests.
int64_t cuda_graph_replays(const Backend& backend);

// The GPU time, summed over a CUDA backend's steps so far, from the first launch of a step's layers (the embedding)
// to the end of its last (lm_head), measured by CUDA events (0 for any other backend): what remains of a step's
// wall time is the host's work and the sampling. For benchmarks.
double cuda_layers_gpu_seconds(const Backend& backend);

// The bytes the CUDA backend's weights take on the GPU in that mode (the f32 mode holds 16-bit checkpoints
// at twice their size), for memory plans; needs no GPU.
int64_t cuda_weight_bytes(const model::Model& model, const std::string& weights);

// A device-to-device cudaMemcpy of `bytes` (best of a few), in GB/s counting bytes read plus bytes written:
// the copy ceiling that benchmarks print beside their figures.
double cuda_copy_gb_per_s(int64_t bytes);

// Free memory on the current GPU (cudaMemGetInfo), for memory budgets given as a fraction.
int64_t cuda_available_memory_bytes();

// Starts or stops the profilers' capture (cudaProfilerStart/Stop), so that `ncu --profile-from-start off` or
// `nsys --capture-range=cudaProfilerApi` see only the part of a run that matters.
void cuda_profiler_capture(bool on);

// Whether a CUDA device can be used here (for tests that skip without one).
bool cuda_device_available();

}  // namespace jambo::backend::cuda
