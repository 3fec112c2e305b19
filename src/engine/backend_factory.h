// Where the model runs, as typed values parsed once where they enter (the CLI's flags), and the backend built
// from them, so that every command and the server can run on either backend with one flag.
#pragma once

#include "backend/backend.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace jambo::engine {

enum class BackendKind { Cpu, Cuda };

// The CUDA backend's weights: F32 (upcast at load, within 1e-4 of the CPU), Bf16 (GEMM weights as stored) or F16
// (GEMM weights converted to IEEE half). Not a DType: Bf16 keeps an fp32 checkpoint's matrices in fp32.
enum class CudaWeights { F32, Bf16, F16 };

// The CUDA backend's GEMMs: Invariant (the default: our own GEMM in one order for every row count, any weight mode,
// so that a row's GEMM outputs do not depend on its batch; docs/DESIGN.md: GPU invariance) or Cublas (opt-in:
// cuBLAS/cuBLASLt, and for 16-bit weights the skinny GEMM with its decode fusions; faster at most shapes today, its
// sums ordered by the step's row count).
enum class CudaGemm { Cublas, Invariant };

// Where and how one model runs: the backend, the CUDA backend's weight mode (the CPU backend ignores it), the
// recurrent state's storage (F32, or BF16 at half the memory; CacheConfig::state_dtype) and the ranks the model is
// split over (model/tensor_parallel.h; on CUDA one GPU each).
struct BackendChoice {
  BackendKind kind = BackendKind::Cpu;
  CudaWeights cuda_weights = CudaWeights::F32;
  CudaGemm cuda_gemm = CudaGemm::Invariant;
  DType state_dtype = DType::F32;
  int64_t tensor_parallel_size = 1;
};

// The choice in words, as output lines name the backend that made them: "cpu (f32 state)",
// "cuda (bf16 weights, invariant GEMMs, f32 state)", "cpu (f32 state, 2 tensor-parallel ranks)". The CPU backend's
// words leave out what it ignores.
std::string describe(const BackendChoice& choice);

// Why the choice's logprobs may differ from its own reference path's (a one-shot prefill of each sequence alone),
// or nothing where they cannot: the choice is then batch-, chunk- and phase-invariant (docs/DESIGN.md), its forensics
// hold it to a threshold of 0. That is the CPU backend, and the CUDA backend on the invariant GEMMs (any weight mode),
// each with an fp32 state, split over any number of ranks (a reference split the same way gives the same bits).
std::optional<std::string> why_not_bitwise(const BackendChoice& choice);

// The flags' spellings: "cpu", "cuda"; "f32", "bf16", "f16"; "cublas", "invariant"; "f32", "bf16".
std::string_view name(BackendKind kind);
std::string_view name(CudaWeights weights);
std::string_view name(CudaGemm gemm);
std::string_view state_dtype_name(DType dtype);

// The backends this build has, Cpu first.
std::vector<BackendKind> available_backends();

// The valid spellings, for help texts: of this build's backends, of the weight modes, of the state dtypes.
std::vector<std::string_view> backend_names();
std::vector<std::string_view> cuda_weights_names();
std::vector<std::string_view> cuda_gemm_names();
std::vector<std::string_view> state_dtype_names();

// Each throws jambo::Error naming the value and listing the valid ones; a backend not in this build is refused.
BackendKind parse_backend_kind(const std::string& text);
CudaWeights parse_cuda_weights(const std::string& text);
CudaGemm parse_cuda_gemm(const std::string& text);
DType parse_state_dtype(const std::string& text);

// Throws jambo::Error naming the backend when it is not in this build, and the reason when the model cannot be split
// over the tensor-parallel ranks. The CPU backend ignores cuda_weights and cuda_gemm; the cache's state dtype is the
// cache's, not the choice's.
std::unique_ptr<backend::Backend> make_backend(const BackendChoice& choice, const model::Model& model,
                                               const backend::CacheConfig& cache);

// The bytes of weights that backend holds for the model (what a memory plan takes before the caches): the
// checkpoint's bytes on the CPU, which reads the mmap; on the GPU what the weight mode uploads.
int64_t backend_weight_bytes(BackendKind kind, const model::Model& model, CudaWeights cuda_weights = CudaWeights::F32);

// What one memory of the backend holds, for a memory plan: on the CUDA backend each GPU holds one tensor-parallel
// rank's shard (the config's local sizes, which size its state slots and KV blocks, and the shard's weights, rank 0's
// being the largest); the CPU backend's ranks share the host's memory and hold the whole model between them.
struct MemoryShare {
  model::JambaConfig config;
  int64_t weight_bytes = 0;
};
MemoryShare memory_share(const BackendChoice& choice, const model::Model& model);

// The memory a backend's caches can take now, for budgets given as a fraction: MemAvailable of
// /proc/meminfo for the CPU, the GPU's free memory for CUDA. Throws jambo::Error like make_backend.
int64_t available_memory_bytes(BackendKind kind);

}  // namespace jambo::engine
